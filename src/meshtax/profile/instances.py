"""Probe windows spread over several sidecar instances (``Plan.probe_instances``).

Two profiles taken back to back, each with its own pods and sidecar, differ on some
components beyond what their probe windows can tell apart, and the median of a few profiles
carries across an hour where one does not (BENCHMARKS.md issue #14, run 16): each instance
holds its own level for its minutes. So a size's windows can be taken in groups, the sidecar
stopped and started afresh between them (same configuration, same pod), and pooled
(:func:`~meshtax.profile.probed.pool`): the components average over the instances and their
interval holds the instances' spread.

A mode's windows can also be spread over the whole run (``Plan.probe_rounds``,
:func:`early_rounds`): early rounds of every mode's windows first, each through a fresh
sidecar, pooled with the mode's own measurement later. Instances inside one mode's minutes
did not carry a profile across an hour (run 17: a whole mode's components moved together with
the machine), medians of profiles spread over ten minutes did (run 16). With
``Plan.round_beds`` each early round also builds its bed afresh (testbed, pods, echo app), as
run 16's profiles each did: what a bed holds for its minutes is then sampled once a round.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends, _real_probe
from meshtax.profile.onehop import WindowPolicy, probe_pairs
from meshtax.profile.plan import Plan, window_policy
from meshtax.profile.probed import ProbedPairs, ProbeResult, pool
from meshtax.testbed.bed import OneHop
from meshtax.testbed.interference import MeterFactory
from meshtax.testbed.probes import ProbeSession
from meshtax.testbed.proxy import Proxy
from meshtax.testbed.system import System

__all__ = ["Sidecar", "early_rounds", "idle_cpu_us_per_s", "probe_instances"]


class Sidecar:
    """The sidecar a measurement runs through, replaceable by a fresh instance: ``start``
    starts one (the same configuration each time)."""

    def __init__(self, start: Callable[[], Proxy]) -> None:
        self._start = start
        self.proxy: Proxy | None = start()

    @property
    def pid(self) -> int:
        if self.proxy is None:
            raise RuntimeError("the sidecar is stopped")
        return self.proxy.pid

    def renew(self) -> None:
        """Stop this instance and start the next."""
        self.stop()
        self.proxy = self._start()

    def stop(self) -> None:
        if self.proxy is not None:
            proxy, self.proxy = self.proxy, None
            proxy.stop()


def idle_cpu_us_per_s(pid: int, seconds: float, be: Backends) -> float:
    """CPU-µs per second the proxy ``pid`` burns with no traffic (every thread: timers, stats
    flushes, the main thread's housekeeping), over a window of ``seconds``."""
    t0, s0 = be.clock(), sum(be.schedstat(pid).values())
    be.sleep(seconds)
    t1, s1 = be.clock(), sum(be.schedstat(pid).values())
    return max(s1 - s0, 0) / 1e3 / (t1 - t0) if t1 > t0 else 0.0


def probe_instances(
    bed: OneHop,
    mode: Mode,
    size: int,
    sidecar: Sidecar,
    *,
    instances: int,
    windows: WindowPolicy,
    warm: Callable[[], object],
    probe_app: bool = True,
    probe: Callable[[System], ProbeSession] = _real_probe,
    meter: MeterFactory | None = None,
    rt_priority: int | None = None,
    earlier: Sequence[ProbedPairs] = (),
) -> ProbeResult:
    """The probe windows of ``mode`` and ``size`` in ``instances`` groups, each with its share
    of ``windows``; before each group after the first the sidecar is renewed and ``warm``
    run (connections, allocator, caches), then pooled, after the ``earlier`` rounds' windows
    (:func:`early_rounds`); the rest as :func:`~meshtax.profile.onehop.probe_pairs`. One
    instance and no earlier round: its windows pooled as they are (no renewal, no warm-up,
    records untagged)."""
    share = windows.share(instances)
    parts = list(earlier)
    for i in range(instances):
        if i:
            sidecar.renew()
            warm()
        parts.append(
            probe_pairs(
                bed,
                mode,
                size,
                sidecar.pid,
                windows=share,
                probe_app=probe_app,
                probe=probe,
                meter=meter,
                rt_priority=rt_priority,
            )
        )
    return pool(parts, cpu_chain=bed.cpu_chain, probe_app=probe_app, what=f"{mode.value} {size} B")


def early_rounds(
    plan: Plan,
    beds: Callable[[], AbstractContextManager[OneHop]],
    *,
    tick: Callable[[str, Mode, int], object] = lambda kind, mode, size: None,
    probe: Callable[[System], ProbeSession] = _real_probe,
    meter: MeterFactory | None = None,
) -> dict[Mode, dict[int, list[ProbedPairs]]]:
    """Rounds 1 … N−1 of every mode's probe windows (``plan.probe_rounds`` = N), modes in
    turn: per round the bed ``beds()`` opens (the profile's own, or with ``plan.round_beds``
    one built afresh: pods, app and all), per mode on it a fresh sidecar, each size warmed on
    both paths and probed with its share of the windows (one of N), the sidecar stopped. Pass
    a mode's parts of a size as ``earlier`` to :func:`probe_instances`, which takes the last
    round."""
    out: dict[Mode, dict[int, list[ProbedPairs]]] = {m: {} for m in plan.modes}
    windows = window_policy(plan).share(plan.probe_rounds)
    for _ in range(plan.probe_rounds - 1):
        with beds() as bed:
            _round(plan, bed, windows, out, tick, probe, meter)
    return out


def _round(
    plan: Plan,
    bed: OneHop,
    windows: WindowPolicy,
    out: dict[Mode, dict[int, list[ProbedPairs]]],
    tick: Callable[[str, Mode, int], object],
    probe: Callable[[System], ProbeSession],
    meter: MeterFactory | None,
) -> None:
    """One early round of every mode on ``bed``, its parts appended to ``out``."""
    for mode in plan.modes:
        tick("setup", mode, 0)
        sidecar = Sidecar(functools.partial(bed.start_sidecar, mode))
        try:
            for size in plan.sizes:
                tick("round", mode, size)
                for target in (bed.direct_target(mode), bed.meshed_target):
                    bed.load(target, mode, size, n=plan.warmup_n)
                part = probe_pairs(
                    bed,
                    mode,
                    size,
                    sidecar.pid,
                    windows=windows,
                    probe_app=plan.probe_app,
                    probe=probe,
                    meter=meter,
                    rt_priority=plan.probe_rt_priority,
                )
                out[mode].setdefault(size, []).append(part)
        finally:
            sidecar.stop()
