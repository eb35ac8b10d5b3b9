"""Which sidecar proxy a profile measures, and how its app-facing legs work (pure data).

:data:`TRAITS` says what each proxy can do (protocol modes, IPC and write variants);
:class:`ProxyChoice` is what a user picks (``meshtax profile --proxy … --ipc … --write …``) and
what a profile's platform records (``Platform.proxy``, ``Platform.variant``). How a proxy is
run is :mod:`meshtax.testbed.proxy`, one entry per name here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from meshtax.errors import ModelError
from meshtax.model.sidecar import Mode

__all__ = ["IPCS", "TRAITS", "WRITES", "ProxyChoice", "ProxyError", "ProxyTraits"]

#: app↔sidecar legs: loopback TCP, Unix domain sockets, or loopback TCP redirected socket to
#: socket by sockmap/sk_msg (as Merbridge and Cilium do)
IPCS = ("tcp", "uds", "sockmap")
#: the sidecar's sends: copied, or ``MSG_ZEROCOPY``
WRITES = ("copy", "zerocopy")


class ProxyError(ModelError):
    """A proxy cannot do what was asked (an unknown proxy, a mode or variant it lacks)."""


@dataclass(frozen=True)
class ProxyTraits:
    """What one proxy can do."""

    modes: tuple[Mode, ...]
    ipcs: tuple[str, ...]
    writes: tuple[str, ...]
    what: str


TRAITS: dict[str, ProxyTraits] = {
    "envoy": ProxyTraits((Mode.TCP, Mode.HTTP, Mode.GRPC), IPCS, ("copy",), "Envoy, L4 and L7"),
    "refsidecar": ProxyTraits((Mode.TCP,), IPCS, ("copy", "zerocopy"), "the reference L4 sidecar"),
    # loopback TCP only: their upstreams are host:port here (no Unix-socket or sockmap bed)
    "haproxy": ProxyTraits(tuple(Mode), ("tcp",), ("copy",), "HAProxy, L4 and L7"),
    "nginx": ProxyTraits(tuple(Mode), ("tcp",), ("copy",), "nginx, L4 and L7"),
    # what it can do is the user's to know: any mode, loopback TCP to the app
    "custom": ProxyTraits(
        tuple(Mode), ("tcp",), ("copy",), "a proxy you bring (--proxy-binary, --proxy-config)"
    ),
}


@dataclass(frozen=True)
class ProxyChoice:
    """Which proxy, and how its app-facing legs work.

    ``ipc``: one of :data:`IPCS`; ``write``: ``copy`` or ``zerocopy`` (``MSG_ZEROCOPY`` for
    sends of at least ``zerocopy_min`` bytes; 0: every send, so a profile shows what zero-copy
    does at each size — the threshold is a deployment choice a what-if can make per size).
    A ``custom`` proxy (:mod:`meshtax.testbed.custom`): its ``binary``, its config
    ``template`` (the text), the ``args`` it is started with (a template too; empty: the
    default) and the ``name`` a profile's platform calls it by.
    """

    kind: str = "envoy"
    ipc: str = "tcp"
    write: str = "copy"
    zerocopy_min: int = 0
    binary: str = ""
    template: str = ""
    args: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        t = TRAITS.get(self.kind)
        if t is None:
            raise ProxyError(f"unknown proxy {self.kind!r}; expected {', '.join(TRAITS)}")
        if self.ipc not in t.ipcs:
            raise ProxyError(f"{self.kind} has no ipc {self.ipc!r} (it has {', '.join(t.ipcs)})")
        if self.write not in t.writes:
            others = [n for n, k in TRAITS.items() if self.write in k.writes]
            raise ProxyError(
                f"{self.kind} has no {self.write} writes (it has {', '.join(t.writes)})"
                + (f"; use --proxy {' or '.join(others)}" if others else "")
            )
        if self.write == "zerocopy" and self.ipc == "sockmap":
            # measured (refsidecar/README.md): the redirected send path ignores MSG_ZEROCOPY
            # and never posts a completion, so the sender holds every buffer until it exits
            raise ProxyError("zero-copy writes and sockmap redirection do not compose")
        if self.zerocopy_min < 0:
            raise ProxyError("zerocopy_min must be >= 0 bytes")
        own = (self.binary, self.template, self.args, self.name)
        if self.kind == "custom" and not (self.binary and self.template):
            raise ProxyError("a proxy you bring needs its binary and a config template")
        if self.kind != "custom" and any(own):
            raise ProxyError(f"{self.kind} is meshtax's to configure: no binary or template")

    @property
    def traits(self) -> ProxyTraits:
        return TRAITS[self.kind]

    @property
    def variant(self) -> str:
        """What differs from the proxy's plain set-up (``""``: loopback TCP, copying writes)."""
        parts = [] if self.ipc == "tcp" else [f"ipc={self.ipc}"]
        if self.write != "copy":
            parts.append(f"write={self.write}(min={self.zerocopy_min})")
        return ",".join(parts)

    def check_modes(self, modes: Iterable[Mode]) -> None:
        """Refuse modes this proxy cannot run (an L4 proxy parses no HTTP)."""
        bad = [m.value for m in modes if m not in self.traits.modes]
        if bad:
            ok = ", ".join(m.value for m in self.traits.modes)
            can = [n for n, t in TRAITS.items() if all(Mode(b) in t.modes for b in bad)]
            raise ProxyError(
                f"{self.kind} ({self.traits.what}) runs {ok} mode only, not {', '.join(bad)}"
                + (f"; use --proxy {' or '.join(can)} for those" if can else "")
            )

    @property
    def label(self) -> str:
        """What a profile's platform calls the proxy (a custom one: ``custom:<name>``)."""
        return f"custom:{self.name or 'proxy'}" if self.kind == "custom" else self.kind

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"proxy": self.kind, "ipc": self.ipc, "write": self.write}
        if self.write == "zerocopy":
            d["zerocopy_min"] = self.zerocopy_min
        if self.kind == "custom":  # the whole template: the profile says what ran
            d.update(binary=self.binary, template=self.template, args=self.args, name=self.name)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProxyChoice:
        return cls(
            str(d.get("proxy", "envoy")),
            str(d.get("ipc", "tcp")),
            str(d.get("write", "copy")),
            int(d.get("zerocopy_min", 0)),
            *(str(d.get(k, "")) for k in ("binary", "template", "args", "name")),
        )

    def describe(self) -> str:
        return self.label + (f" ({self.variant})" if self.variant else "")
