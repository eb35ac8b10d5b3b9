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


#: TLS versions a sidecar's mTLS can be pinned to (``SidecarConfig.tls_version``)
TLS_VERSIONS: tuple[str, ...] = ("1.2", "1.3")


class Architecture(str, Enum):
    """Where the proxies sit (:mod:`meshtax.predict.architecture` prices each).

    ``sidecar``: one per pod; ``node-l4``: one L4 proxy per node (the ambient ztunnel role);
    ``waypoint``: ``node-l4`` plus an L7 proxy in front of the destination service;
    ``none``: no proxy, no overhead.
    """

    SIDECAR = "sidecar"
    NODE_L4 = "node-l4"
    WAYPOINT = "waypoint"
    NONE = "none"


@dataclass(frozen=True)
class SidecarConfig:
    """Protocol mode, ordered filter chain, mTLS, and mesh architecture.

    ``tls_version`` pins the mTLS version ("1.2" or "1.3"; None: whatever the profile measured
    first). It matters: a TLS 1.3 reconnection still does a full key exchange, a TLS 1.2 one
    resumes without (this machine: 444 vs 218 CPU-µs per connection through a pair).
    """

    mode: Mode = Mode.HTTP
    filters: tuple[str, ...] = ()
    mtls: bool = False
    architecture: Architecture = Architecture.SIDECAR
    tls_version: str | None = None

    def __post_init__(self) -> None:
        if self.tls_version is not None:
            if self.tls_version not in TLS_VERSIONS:
                raise ValueError(
                    f"tls_version {self.tls_version!r}: expected one of {', '.join(TLS_VERSIONS)}"
                )
            if not self.mtls:
                raise ValueError(
                    f"tls_version {self.tls_version} without mtls: set mtls: true, or drop tls_version"
                )

    @property
    def meshed(self) -> bool:
        return self.architecture is not Architecture.NONE

    def describe(self) -> str:
        if not self.meshed:
            return "no sidecar"
        parts = [self.mode.value]
        if self.architecture is not Architecture.SIDECAR:
            parts.insert(0, self.architecture.value)
        if self.filters:
            parts.append("+" + "+".join(self.filters))
        if self.mtls:
            parts.append("mTLS" if self.tls_version is None else f"mTLS {self.tls_version}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "filters": list(self.filters),
            "mtls": self.mtls,
            "architecture": self.architecture.value,
            # written only when pinned, so configurations without it keep their exact shape
            **({} if self.tls_version is None else {"tls_version": self.tls_version}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SidecarConfig:
        return cls(
            mode=Mode(d.get("mode", "http")),
            filters=tuple(d.get("filters", ())),
            mtls=bool(d.get("mtls", False)),
            architecture=Architecture(d.get("architecture", "sidecar")),
            tls_version=None if d.get("tls_version") is None else str(d["tls_version"]),
        )


NO_SIDECAR = SidecarConfig(architecture=Architecture.NONE)
