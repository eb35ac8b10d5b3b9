"""Machine speed as a measured variable (pure).

On a shared VM the time per instruction drifts (the host's other tenants, frequency), while
the work a sidecar does per message does not. A profile therefore records how fast the machine
was when it measured (:class:`Speed`, from the fixed reference workload ``speedref``: a
cross-CPU and a same-CPU loopback ping-pong and a user-space parsing loop), and a prediction
made at another time can scale each component by how much faster or slower the same kind of
work runs now (:func:`speed_factor`): the kernel's message path (IPC, Read, Write) by the
same-CPU ping-pong, wake-ups (Notification) by the cross-CPU ping-pong, user-space work
(Parsing, Other, filters, TLS) by the user loop.

The user loop lives in the L1 cache. Two quick profiles two hours apart (issue #14, seventh
sitting) found every user-space component of the later one 12–28 % higher while the loop ran
5 % *faster*: whatever slows a sidecar's user space (a host co-tenant taking cache or memory
bandwidth) does not touch it. A speed may therefore also carry ``sidecar_ns``: the CPU a real
sidecar (Envoy, an HTTP proxy on loopback, one request in flight) spends per request, measured
beside the loop; when both speeds have it, user-space work scales by it instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshtax.model.components import IPC, NOTIFICATION, READ, WRITE, Component

__all__ = [
    "BUSY_HOST_STALLS",
    "KINDS",
    "Speed",
    "busy_host_note",
    "describe_scaling",
    "kind_factors",
    "kind_of",
    "speed_factor",
    "typical",
]

#: which reference path each kind of component runs on
KINDS = ("local", "cross", "user")


@dataclass(frozen=True)
class Speed:
    """ns per same-CPU round trip (``local``), per cross-CPU round trip (``cross``) and per
    user-space iteration (``user``) of the reference workload, and when it was measured;
    ``sidecar_ns``: a reference sidecar's CPU per request (None: not measured)."""

    local_ns: float
    cross_ns: float
    user_ns: float
    measured: str = ""
    sidecar_ns: float | None = None

    def __post_init__(self) -> None:
        for k in (*KINDS, "sidecar"):
            v = getattr(self, f"{k}_ns")
            if k == "sidecar" and v is None:
                continue
            if not (isinstance(v, (int, float)) and 0 < v < 1e12):
                raise ValueError(f"speed {k}_ns must be a positive finite number, got {v!r}")

    def ns(self, kind: str) -> float:
        return float(getattr(self, f"{kind}_ns"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_ns": self.local_ns,
            "cross_ns": self.cross_ns,
            "user_ns": self.user_ns,
            "measured": self.measured,
            **({} if self.sidecar_ns is None else {"sidecar_ns": self.sidecar_ns}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Speed:
        sc = d.get("sidecar_ns")
        return cls(
            float(d["local_ns"]),
            float(d["cross_ns"]),
            float(d["user_ns"]),
            str(d.get("measured", "")),
            None if sc is None else float(sc),
        )


def kind_of(component: Component) -> str:
    """The reference path a component's time scales with."""
    if component in (IPC, READ, WRITE):
        return "local"
    if component == NOTIFICATION:
        return "cross"
    return "user"


def _ratio(kind: str, now: Speed, then: Speed) -> float:
    if kind == "user" and now.sidecar_ns is not None and then.sidecar_ns is not None:
        return now.sidecar_ns / then.sidecar_ns
    return now.ns(kind) / then.ns(kind)


def speed_factor(component: Component, now: Speed, then: Speed) -> float:
    """How much longer ``component`` takes now than when ``then`` was measured (user-space
    work by the reference sidecar when both speeds measured one, else by the user loop)."""
    return _ratio(kind_of(component), now, then)


def kind_factors(now: Speed, then: Speed) -> dict[str, float]:
    """How much longer each kind of work takes now than when ``then`` was measured."""
    return {k: _ratio(k, now, then) for k in KINDS}


_KIND_NAMES = {
    "local": "kernel message path",
    "cross": "cross-CPU wake-up",
    "user": "user-space work",
}


def describe_scaling(now: Speed, then: Speed) -> str:
    """One line saying how a prediction's costs were scaled from ``then`` to ``now``."""
    by_sidecar = now.sidecar_ns is not None and then.sidecar_ns is not None
    parts = ", ".join(
        f"{_KIND_NAMES[k]}{' (reference sidecar)' if k == 'user' and by_sidecar else ''} ×{f:.3f}"
        for k, f in kind_factors(now, then).items()
    )
    return f"costs scaled to the machine's speed now ({parts})"


def typical(samples: Sequence[Speed]) -> Speed:
    """The median of each path over several measurements (the profile's speed)."""
    if not samples:
        raise ValueError("no speed samples")

    def med(xs: list[float]) -> float:
        s = sorted(xs)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    sidecar = [s.sidecar_ns for s in samples if s.sidecar_ns is not None]
    return Speed(
        med([s.local_ns for s in samples]),
        med([s.cross_ns for s in samples]),
        med([s.user_ns for s in samples]),
        samples[-1].measured,
        med(sidecar) if sidecar else None,
    )


#: host wake stalls a second (the median over a profile's sizes of each size's median window)
#: from which a profile was measured on a busy host: this machine's nine quick profiles of
#: issue #14 (sittings 10–14) lay at 8–17 or at 47–57 a second, and tcp Notification mostly
#: 1.5–3× higher in the second group (:mod:`meshtax.testbed.interference`)
BUSY_HOST_STALLS = 30.0


def busy_host_note(interference: Mapping[str, Any]) -> str | None:
    """A sentence when a profile's interference record says the host stalled its vCPUs'
    wake-ups at a busy host's rate (None otherwise, or when it was not recorded)."""
    rate = interference.get("stalls_median")
    if rate is None or float(rate) < BUSY_HOST_STALLS:
        return None
    return (
        f"measured on a busy host: its vCPUs' wake-ups stalled ≥ 130 µs {float(rate):.0f} "
        f"times a second (a quiet host: under {BUSY_HOST_STALLS:.0f}); wake-up costs "
        "(Notification) can be 1.5–3× a quiet host's"
    )
