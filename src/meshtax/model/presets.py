"""Named filter presets: chains a mesh configures by default, written as profiled filters.

``istio-default`` is the per-request telemetry Istio's sidecar adds to every HTTP chain:
metadata exchange (``istio.metadata_exchange`` / ``peer_metadata``) and stats
(``istio.stats``). Neither is in upstream Envoy, so each is profiled as a *stand-in*: a Lua
filter doing the same per-request work (:data:`STAND_INS` says what it does and what it
leaves out). The rest of Istio's default HTTP chain costs nothing modelled: the empty fault
and CORS filters do no per-request work and the router is the base mode; ``grpc_stats`` has
no profile (listed by the importers). In TCP mode Istio's telemetry is a pair of network
filters run per connection, which the preset leaves out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshtax.model.sidecar import Mode

__all__ = ["ISTIO_DEFAULT", "PRESETS", "STAND_INS", "expand"]

#: stand-in filter → what it stands for and how (the profiler's catalogue builds them)
STAND_INS: Mapping[str, str] = {
    "istio_metadata_exchange": (
        "stand-in for Istio's metadata exchange (istio.metadata_exchange/peer_metadata): a Lua "
        "filter that reads and removes the peer's x-envoy-peer-metadata headers and adds the "
        "sidecar's own (~0.5 KB); Istio's C++ filter also decodes the peer's protobuf"
    ),
    "istio_stats": (
        "stand-in for Istio's stats filter (istio.stats): a Lua filter that builds the request's "
        "standard labels and updates the four standard metrics (requests, duration, request "
        "and response bytes) in a Lua table instead of Envoy's stats store"
    ),
}

ISTIO_DEFAULT = "istio-default"
#: preset name → its filters in HTTP/gRPC mode, in chain order
PRESETS: Mapping[str, tuple[str, ...]] = {
    ISTIO_DEFAULT: ("istio_metadata_exchange", "istio_stats"),
}


def expand(filters: Sequence[str], mode: Mode) -> tuple[str, ...]:
    """``filters`` with every preset name replaced by its filters (none in tcp mode: Istio's
    TCP telemetry runs per connection, which meshtax does not model)."""
    out: list[str] = []
    for f in filters:
        chain = PRESETS.get(f)
        if chain is None:
            out.append(f)
        elif mode is not Mode.TCP:
            out.extend(chain)
    return tuple(out)
