"""Variants in one Envoy on loopback: where filters, mTLS, per-connection costs and large
messages are measured.

:func:`variant_envoy` starts a fortio echo app and one Envoy holding every variant of a
comparison (:mod:`meshtax.testbed.envoy.variants`), in an open testbed (its processes are
recorded and reaped after a crash, its scratch directory removed). :class:`VariantEnvoy`
runs one measurement of one variant; the comparisons themselves go through the one paired-run
loop (:func:`~meshtax.testbed.paired.paired_runs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends, LoadFn, loopback_load
from meshtax.testbed.callgrind import CallgrindSpec
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.envoy.variants import LO, Variant, multi_bootstrap
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import Placement

__all__ = ["CLIENT_CPU", "SIDECAR_CPU", "Builder", "VariantEnvoy", "variant_envoy"]

CLIENT_CPU = Placement(cpus=(0,))  # pinned runs: the load generator
SIDECAR_CPU = Placement(cpus=(1,))  # … Envoy and the echo app

#: (variant ports, echo address, output directory) → the variants, in port order
Builder = Callable[[Sequence[int], tuple[str, int], Path], list[Variant]]


@dataclass
class VariantEnvoy:
    """A running multi-variant Envoy with its echo app: one measured run of a variant."""

    env: EnvoyProcess
    variants: Mapping[str, Variant]
    mode: Mode
    be: Backends
    load: LoadFn

    def target(self, name: str) -> str:
        return f"{LO}:{self.variants[name].port}"

    def run(self, name: str, size: int, n: int, mode: Mode | None = None) -> tuple[float, float]:
        """``n`` closed-loop requests of ``size`` through variant ``name`` → (worker CPU µs per
        request, mean latency µs)."""
        c0 = self.be.cpu_ns(self.env.pid)
        res = self.load(self.target(name), mode or self.mode, size, n)
        return (self.be.cpu_ns(self.env.pid) - c0) / 1e3 / res.count, res.avg_us

    def connect(self, name: str, k: int) -> tuple[float, float]:
        """``k`` new connections through ``name``, one message each → (worker CPU µs per
        connection, µs per connection)."""
        c0 = self.be.cpu_ns(self.env.pid)
        t = self.be.connect(self.variants[name].port, k, self.mode)
        return (self.be.cpu_ns(self.env.pid) - c0) / 1e3 / k, t * 1e6

    def warm(self, size: int, n: int) -> dict[str, float]:
        """``n`` requests through every variant (connections, allocator, caches); returns each
        variant's mean latency."""
        return {v: self.load(self.target(v), self.mode, size, n).avg_us for v in self.variants}


@contextmanager
def variant_envoy(
    tb: Testbed,
    be: Backends,
    mode: Mode,
    build: Builder,
    n_variants: int,
    *,
    label: str,
    callgrind: bool | CallgrindSpec = False,
    pin: bool = False,
    alone: bool = False,
    stdclient: bool = False,
    bootstrap: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
) -> Iterator[VariantEnvoy]:
    """An echo app and one Envoy serving ``build``'s variants, in ``tb``'s scratch directory
    ``meshtax-<label>-…``; ``pin``: the client on CPU 0, Envoy and the echo app on CPU 1
    (``alone``: Envoy alone on CPU 1, the echo app with the client on CPU 0);
    ``callgrind``: Envoy under callgrind (:class:`~meshtax.testbed.envoy.process.EnvoyProcess`);
    ``bootstrap``: top-level fields added to Envoy's bootstrap; ``args``: to its command line."""
    system = tb.registered
    work = tb.scratch_dir(f"meshtax-{label}-")
    # the admin port is chosen with the others: chosen apart, a port just released could
    # come back as the admin port
    ports = be.free_ports(2 + n_variants)
    echo_port, admin, vports = ports[0], ports[1], ports[2:]
    variants = build(vports, (LO, echo_port), work / "out")
    for v in variants:
        for o in v.outputs:
            Path(o).parent.mkdir(parents=True, exist_ok=True)
    place = SIDECAR_CPU if pin else Placement()
    client = CLIENT_CPU if pin else Placement()
    app = client if alone else place
    load = be.load or loopback_load(tb.system, stdclient=stdclient, place=client)
    with (
        be.echo(system, work / "echo", mode, echo_port, app),
        be.envoy(
            system,
            multi_bootstrap(variants, admin, bootstrap),
            work / "envoy",
            place,
            callgrind=callgrind,
            **({"extra_args": tuple(args)} if args else {}),
        ) as env,
    ):
        yield VariantEnvoy(env, {v.name: v for v in variants}, mode, be, load)
