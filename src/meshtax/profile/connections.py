"""Per new connection: a filter that runs once per connection (network RBAC) against base, in
one Envoy on loopback, through the one paired-run loop (:mod:`meshtax.profile.loopback`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.backends import Backends
from meshtax.profile.loopback import variant_envoy
from meshtax.testbed.envoy.variants import BASE, Variant, filter_variants
from meshtax.testbed.paired import PairPolicy, paired_runs
from meshtax.testbed.pods import Testbed

__all__ = ["ConnectionMeasurement", "measure_connections"]


@dataclass(frozen=True)
class ConnectionMeasurement:
    """One component's cost per new connection through one sidecar (component − base, µs),
    with 95 % intervals over paired rounds; ``connections`` per run."""

    name: str
    mode: Mode
    connections: int
    cpu_us: Estimate
    latency_us: Estimate
    base_cpu_us: float
    base_latency_us: float

    def model(self) -> ComponentModel:
        """Intercept-only models per connection per sidecar, every round a sample."""
        note = (
            f"{self.name} per new {self.mode.value}-mode connection (one message each), component minus base "
            "in one Envoy, paired alternating runs; worker thread CPU, client-side connection time"
        )
        zeros = [0.0] * len(self.cpu_us.samples)
        return ComponentModel(
            CostModel.fit(zeros, list(self.latency_us.samples), note=note),
            CostModel.fit(zeros, list(self.cpu_us.samples), note=note),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode.value,
            "connections_per_run": self.connections,
            "cpu_us_per_connection": self.cpu_us.to_dict(),
            "latency_us_per_connection": self.latency_us.to_dict(),
            "base_cpu_us_per_connection": self.base_cpu_us,
            "base_latency_us_per_connection": self.base_latency_us,
        }


def measure_connections(
    tb: Testbed,
    be: Backends,
    mode: Mode,
    components: Sequence[str],
    rounds: int,
    *,
    k: int = 200,
    progress: Callable[[str], None] | None = None,
) -> dict[str, ConnectionMeasurement]:
    """Each component against base in one Envoy (any mode: ``Backends.connect``), ``rounds``
    paired rounds of ``k`` new connections, one message each."""
    say = progress or (lambda _m: None)

    def build(ports: Sequence[int], echo: tuple[str, int], out: Any) -> list[Variant]:
        return filter_variants(mode, components, ports, echo, outdir=out)

    n = 1 + len(components)
    with variant_envoy(tb, be, mode, build, n, label=f"conn-{mode.value}") as ve:
        for v in ve.variants:
            be.connect(ve.variants[v].port, 20, mode)  # the first connections pay lazy set-up
        paired = paired_runs(
            [(BASE, c) for c in components],
            lambda name: ve.connect(name, k),
            PairPolicy.fixed(rounds),
            progress=lambda m: say(f"{mode.value}: per connection, {m}"),
        )
    out: dict[str, ConnectionMeasurement] = {}
    for c in components:
        pairs = paired.pairs(BASE, c)
        if not pairs:
            continue
        dc = [x[0] - b[0] for b, x in pairs]
        dl = [x[1] - b[1] for b, x in pairs]
        base_cpu, base_lat = median([b[0] for b, _ in pairs]), median([b[1] for b, _ in pairs])
        out[c] = ConnectionMeasurement(c, mode, k, estimate(dc), estimate(dl), base_cpu, base_lat)
    return out
