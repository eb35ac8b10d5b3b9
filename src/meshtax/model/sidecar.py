"""Sidecar configuration of one service instance (the S of an ECG)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Mode(str, Enum):
    """The protocol the sidecar proxies at."""

    TCP = "tcp"
    HTTP = "http"
    GRPC = "grpc"


class Architecture(str, Enum):
    """Where the proxy sits. ``none``: no proxy, no overhead."""

    SIDECAR = "sidecar"
    NONE = "none"


@dataclass(frozen=True)
class SidecarConfig:
    """Protocol mode, ordered filter chain, mTLS, and mesh architecture."""

    mode: Mode = Mode.HTTP
    filters: tuple[str, ...] = ()
    mtls: bool = False
    architecture: Architecture = Architecture.SIDECAR

    @property
    def meshed(self) -> bool:
        return self.architecture is not Architecture.NONE

    def describe(self) -> str:
        if not self.meshed:
            return "no sidecar"
        parts = [self.mode.value]
        if self.filters:
            parts.append("+" + "+".join(self.filters))
        if self.mtls:
            parts.append("mTLS")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "filters": list(self.filters),
            "mtls": self.mtls,
            "architecture": self.architecture.value,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SidecarConfig:
        return cls(
            mode=Mode(d.get("mode", "http")),
            filters=tuple(d.get("filters", ())),
            mtls=bool(d.get("mtls", False)),
            architecture=Architecture(d.get("architecture", "sidecar")),
        )


NO_SIDECAR = SidecarConfig(architecture=Architecture.NONE)
