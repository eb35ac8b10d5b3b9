"""Probe windows spread over several sidecar instances (``Plan.probe_instances``).

Two profiles taken back to back, each with its own pods and sidecar, differ on some
components beyond what their probe windows can tell apart, and the median of a few profiles
carries across an hour where one does not (BENCHMARKS.md issue #14, run 16): each instance
holds its own level for its minutes. So a size's windows can be taken in groups, the sidecar
stopped and started afresh between them (same configuration, same pod), and pooled
(:func:`~meshtax.profile.probed.pool`): the components average over the instances and their
interval holds the instances' spread.
"""

from __future__ import annotations

from collections.abc import Callable

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import _real_probe
from meshtax.profile.onehop import WindowPolicy, probe_pairs
from meshtax.profile.probed import ProbeResult, pool
from meshtax.testbed.bed import OneHop
from meshtax.testbed.interference import MeterFactory
from meshtax.testbed.probes import ProbeSession
from meshtax.testbed.proxy import Proxy
from meshtax.testbed.system import System

__all__ = ["Sidecar", "probe_instances"]


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
) -> ProbeResult:
    """The probe windows of ``mode`` and ``size`` in ``instances`` groups, each with its share
    of ``windows``; before each group after the first the sidecar is renewed and ``warm``
    run (connections, allocator, caches), then pooled; the rest as
    :func:`~meshtax.profile.onehop.probe_pairs`. One instance: its windows pooled as they are
    (no renewal, no warm-up, records untagged)."""
    share = windows.share(instances)
    parts = []
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
