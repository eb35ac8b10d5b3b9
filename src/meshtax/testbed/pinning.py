"""Deliberate CPU placement of the load generator, the sidecars and the app.

On a small machine where a cross-CPU wake-up costs tens of µs, where each party runs is part of
the measurement, so it is chosen explicitly and recorded with the results.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from meshtax.model.profile import Profile
from meshtax.testbed.system import Placement

__all__ = [
    "CLIENT_APART",
    "ONE_CPU",
    "UNPINNED",
    "Pinning",
    "available_cpus",
    "default_pinning",
    "nice_of",
    "niceness",
    "pinning_of",
]


def available_cpus() -> tuple[int, ...]:
    """CPUs this process may run on (its affinity mask)."""
    return tuple(sorted(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class Pinning:
    """CPU sets for the load client, the sidecars and the app; ``None`` means unpinned."""

    client: tuple[int, ...] | None = None
    sidecars: tuple[int, ...] | None = None
    app: tuple[int, ...] | None = None

    def place(self, role: str, netns: str | None = None, uid: int | None = None) -> Placement:
        """The :class:`Placement` for ``role`` (``client``, ``sidecars`` or ``app``)."""
        cpus: tuple[int, ...] | None = getattr(self, role)
        return Placement(netns=netns, cpus=cpus, uid=uid)

    def describe(self) -> str:
        def f(c: tuple[int, ...] | None) -> str:
            return "*" if c is None else ",".join(map(str, c))

        return f"client={f(self.client)} sidecars={f(self.sidecars)} app={f(self.app)}"

    def pod_cpus(self, available: Sequence[int] | None = None) -> int:
        """How many CPUs the pods (apps and sidecars) share: the union of their sets; an
        unpinned role may run on any of ``available`` (default: this process's CPUs)."""
        every = tuple(available) if available is not None else available_cpus()
        cpus: set[int] = set()
        for c in (self.sidecars, self.app):
            cpus.update(every if c is None else c)
        return max(1, len(cpus))

    def to_dict(self) -> dict[str, list[int] | None]:
        return {
            k: (None if v is None else list(v))
            for k, v in (("client", self.client), ("sidecars", self.sidecars), ("app", self.app))
        }

    @classmethod
    def from_dict(cls, d: dict[str, list[int] | None]) -> Pinning:
        def t(v: list[int] | None) -> tuple[int, ...] | None:
            return None if v is None else tuple(v)

        return cls(client=t(d.get("client")), sidecars=t(d.get("sidecars")), app=t(d.get("app")))


UNPINNED = Pinning()
# everything on one CPU: no cross-CPU wake-ups (50–100 µs each on the 2-core dev VM); lowest
# and, on a quiet machine, most stable loopback latency in experiments/profile_pinning.py
ONE_CPU = Pinning(client=(0,), sidecars=(0,), app=(0,))
# load client apart from the proxy and app, so its own CPU use does not delay them
CLIENT_APART = Pinning(client=(0,), sidecars=(1,), app=(1,))


def default_pinning(cpus: Sequence[int] | None = None) -> Pinning:
    """Client alone on one CPU; sidecar and app together on another (as in a pod).

    Measured here (experiments/profile_pinning.py): this placement gives the same number of
    cross-CPU wake-ups with and without the sidecar, so their difference is the sidecar's
    own work, and it had the smallest run-to-run spread. One CPU: everything shares it.
    """
    cs = tuple(cpus) if cpus is not None else available_cpus()
    if len(cs) < 2:
        return Pinning(client=cs or None, sidecars=cs or None, app=cs or None)
    return Pinning(client=(cs[0],), sidecars=(cs[1],), app=(cs[1],))


def pinning_of(profile: Profile) -> Pinning:
    """The CPUs ``profile`` was measured on (this machine's default when it did not say)."""
    d = profile.provenance.options.get("pinning")
    return Pinning.from_dict(d) if isinstance(d, dict) else default_pinning()


def nice_of(profile: Profile) -> int | None:
    """The nice value ``profile`` was measured at (the profiler's ``Plan.nice``; None: it did not
    say). What is compared with the profile runs at it too: the tail validation's beds (issue
    #20, sets 7–8: the profile's closed loop at nice −20 came out 8–15 % below the validation's
    at nice 0 on a quiet machine) and the machine-speed readings (issue #14, suite run 9: the
    cases' readings at nice 0 came out below the profile's at −20 in 28 of 33 cases)."""
    v = profile.provenance.options.get("nice")
    return int(v) if isinstance(v, int | float) else None


@contextmanager
def niceness(nice: int | None) -> Iterator[None]:
    """Run the block (and every process it spawns: children inherit it) at ``nice``."""
    if nice is None:
        yield
        return
    old = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, old)
