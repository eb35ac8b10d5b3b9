"""Components: the unit of the cost model (see DESIGN.md, "Components")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    IPC = "ipc"
    READ = "read"
    WRITE = "write"
    NOTIFICATION = "notification"
    PARSING = "parsing"
    FILTER = "filter"
    TLS = "tls"
    OTHER = "other"
    # a published total whose split into components is not available (never a measurement)
    UNATTRIBUTED = "unattributed"


_FILTER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")


@dataclass(frozen=True, order=True)
class Component:
    """One component of a sidecar's per-message overhead; filters carry their name."""

    kind: Kind
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind is Kind.FILTER:
            if not _FILTER_NAME.match(self.name):
                raise ValueError(
                    f"filter name {self.name!r}: expected lower-case letters, digits, _ . -"
                )
        elif self.name:
            raise ValueError(f"only filters have names, got {self.kind.value}:{self.name}")

    @property
    def key(self) -> str:
        """Stable text form: ``ipc``, ``filter:lua``."""
        return f"filter:{self.name}" if self.kind is Kind.FILTER else self.kind.value

    @property
    def label(self) -> str:
        """Human form used in tables: ``IPC``, ``Filter(lua)``."""
        if self.kind is Kind.FILTER:
            return f"Filter({self.name})"
        return {Kind.IPC: "IPC", Kind.TLS: "TLS"}.get(self.kind, str(self.kind.value).capitalize())

    @classmethod
    def parse(cls, text: str) -> Component:
        """Inverse of :attr:`key`; also accepts ``Filter(lua)`` and any case."""
        t = text.strip()
        m = re.fullmatch(r"(?i)filter[:(]\s*([^)]*?)\s*\)?", t)
        if m:
            return cls(Kind.FILTER, m.group(1).lower())
        try:
            return cls(Kind(t.lower()))
        except ValueError:
            known = ", ".join(k.value for k in Kind if k is not Kind.FILTER)
            raise ValueError(
                f"unknown component {text!r}: expected one of {known} or filter:NAME"
            ) from None

    def __str__(self) -> str:
        return self.key


IPC = Component(Kind.IPC)
READ = Component(Kind.READ)
WRITE = Component(Kind.WRITE)
NOTIFICATION = Component(Kind.NOTIFICATION)
PARSING = Component(Kind.PARSING)
TLS = Component(Kind.TLS)
OTHER = Component(Kind.OTHER)
UNATTRIBUTED = Component(Kind.UNATTRIBUTED)

#: Components every mode has, in the paper's table order (parsing is zero in TCP mode).
BASE_COMPONENTS: tuple[Component, ...] = (IPC, READ, WRITE, NOTIFICATION, PARSING, OTHER)


def filter_component(name: str) -> Component:
    return Component(Kind.FILTER, name)


def sized(base: str, n: int) -> str:
    """Name of a filter whose cost depends on its size (RBAC rules, IP tags): ``rbac_http_100``.

    One place decides the spelling, so profiles and imports agree; it fits the ECG schema's
    filter-name pattern (``[a-z0-9][a-z0-9_.-]*``).
    """
    return f"{base}_{n}"
