"""Fakes for the loopback measurements: a world of variants with known per-request costs, an
Envoy that maps listener ports to variant names, and a testbed on a fake system."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.testbed.fortio import LoadResult, LoadSpec
from meshtax.testbed.pods import Testbed
from meshtax.testbed.runstate import FakeProcOps
from meshtax.testbed.system import FakeSystem


def fake_load_result(spec: LoadSpec, n: int, latency_us: float) -> LoadResult:
    return LoadResult(
        spec, n, 0, {"200": n}, 0.0, 0.0, 0.0, latency_us, 0.0, 0.0, {50.0: latency_us}, 1, "fake"
    )


@dataclass
class FakeWorld:
    """Ports → variant names; each request of variant v costs cpu[v] µs, lat[v] µs, instr[v]."""

    cpu: Mapping[str, float]
    lat: Mapping[str, float]
    instr: Mapping[str, float]
    fixed_instr: float = 5000.0  # per counted window: must cancel
    port_names: dict[int, str] = field(default_factory=dict)
    cpu_ns: int = 0
    instr_count: float = 0.0
    loads: list[tuple[str, int, int]] = field(default_factory=list)
    drift: float = 0.0  # added to every request's CPU: paired runs cancel it
    boots: list[Mapping[str, Any]] = field(default_factory=list)  # every Envoy's bootstrap
    args: list[tuple[str, ...]] = field(default_factory=list)  # … and its extra command line

    def load(self, target: str, mode: Mode, size: int, n: int) -> LoadResult:
        name = self.port_names[int(target.rsplit(":", 1)[1])]
        self.loads.append((name, size, n))
        self.cpu_ns += round((self.cpu[name] + self.drift) * 1000 * n)
        self.instr_count += self.instr[name] * n + self.fixed_instr
        return fake_load_result(LoadSpec(target, mode, size, n=n), n, self.lat[name])


class FakeEnvoy:
    """Stands in for a multi-variant :class:`EnvoyProcess`: pid, zero, dump, context manager."""

    def __init__(
        self,
        world: FakeWorld,
        boot: Mapping[str, Any],
        place: Any = None,
        callgrind: bool = False,
    ) -> None:
        self.world = world
        self.callgrind = callgrind
        self.place = place
        self.pid = 4242
        world.boots.append(boot)
        for lst in boot["static_resources"]["listeners"]:
            port = lst["address"]["socket_address"]["port_value"]
            world.port_names[port] = lst["name"][2:]  # "l_<slug>"

    def __enter__(self) -> FakeEnvoy:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def zero(self) -> None:
        self.world.instr_count = 0.0

    def dump(self) -> int:
        got = round(self.world.instr_count)
        self.world.instr_count = 0.0
        return got


@contextmanager
def no_echo(*a: Any) -> Iterator[None]:
    yield


def fake_backends(world: FakeWorld, callgrind: bool = True, **kw: Any) -> Backends:
    ports = iter(range(30000, 40000))

    def envoy(
        system: Any,
        boot: Mapping[str, Any],
        workdir: Path,
        place: Any = None,
        callgrind: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> FakeEnvoy:
        world.args.append(tuple(extra_args))
        return FakeEnvoy(world, boot, place, callgrind)

    return Backends(
        cpu_ns=lambda pid: world.cpu_ns,
        load=world.load,
        envoy=envoy,  # type: ignore[arg-type]
        echo=no_echo,
        free_ports=lambda k: [next(ports) for _ in range(k)],
        callgrind_available=lambda: callgrind,
        **{"meter": None, "speed": None, **kw},
    )


def fake_testbed(state_dir: Path) -> Testbed:
    """An open-able testbed on a :class:`FakeSystem` (no root, nothing real created)."""
    return Testbed(
        FakeSystem(), "abc123", state_dir=state_dir, procs=FakeProcOps(default=lambda p: p * 10)
    )
