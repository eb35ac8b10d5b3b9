"""Filter profiling: every catalogue filter as its own component, by difference.

One Envoy per mode serves every variant at once, each on its own loopback listener with its
own filter chain in front of the same echo app: ``base`` (no filter), each single filter,
and (for the additivity study) each combination. With ``concurrency 1`` one worker thread
serves them all, so "with minus without" compares the same process, the same thread, the same
mode and size, in runs that alternate (the order rotates every round so drift cancels).

Two measures per variant:

* **CPU**: on-CPU ns of the worker thread (``/proc/PID/task/TID/schedstat``, user + kernel)
  over a closed-loop fortio run, per request; filter = variant − base, round by round, with a
  95 % interval over rounds. Latency (fortio's mean) is differenced the same way.
* **Instructions** (optional, ``valgrind --tool=callgrind``): the same Envoy config under
  callgrind; counters are zeroed, ``n1`` then ``n2`` requests are sent and dumped, and
  ``(I(n2) − I(n1)) / (n2 − n1)`` is the steady-state instruction count per request (warm-up,
  connection set-up and per-run fixed work cancel). Deterministic to about 1 %, so it is the
  robust signal on a noisy machine.

Models land in a profile per crossing (one sidecar, one direction): a request and its
response are two crossings, so per-request costs are halved. Every side effect goes through
:class:`~meshtax.testbed.system.System` and the injectable :class:`FilterBackends`.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from h2 import events as h2events
from h2.config import H2Configuration
from h2.connection import H2Connection

from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median
from meshtax.testbed.envoy.config import EnvoyConfig, EnvoyError, bootstrap, envoy_binary
from meshtax.testbed.envoy.filters import (
    COMBINATIONS,
    MIXES,
    FilterSpec,
    catalogue,
    combination,
    component_name,
    filter_config,
    modes_for,
    parse_component,
)
from meshtax.testbed.fortio import FortioServer, LoadResult, LoadSpec, fortio_binary, run_spec
from meshtax.testbed.perf import parse_schedstat
from meshtax.testbed.system import CommandError, Placement, Process, System

__all__ = [
    "BASE",
    "FilterBackends",
    "FilterMeasurement",
    "FilterRunOptions",
    "ModeRun",
    "MultiEnvoy",
    "Variant",
    "VariantSamples",
    "AdditivityRow",
    "Block",
    "BlockRow",
    "additivity",
    "block_additivity",
    "block_order",
    "measure_blocks",
    "profile_blocks",
    "ConnectFn",
    "ConnectionMeasurement",
    "additivity_components",
    "connect_loop",
    "grpc_ping",
    "grpc_ping_message",
    "measure_connections",
    "total_errors_by_round",
    "combos_for",
    "differences",
    "echo_server",
    "free_ports",
    "filter_models",
    "filter_variants",
    "measure_variants",
    "multi_bootstrap",
    "parse_callgrind_total",
    "profile_filters",
    "real_load",
    "resolve_filters",
    "run_length",
    "steady_per_request",
    "variant",
    "worker_cpu_ns",
]

BASE = "base"
LO = "127.0.0.1"
CLIENT_CPU = Placement(cpus=(0,))  # FilterRunOptions.pin: the load generator
SIDECAR_CPU = Placement(cpus=(1,))  # … Envoy and the echo app
CALLGRIND_START_S = 300.0  # Envoy takes ~20 s to start under callgrind (more with big RBAC)


# ---- configs: many variants in one Envoy ----------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One listener (its filter chain) and the cluster it forwards to, named ``name``."""

    name: str
    port: int
    listener: Mapping[str, Any]
    cluster: Mapping[str, Any]
    outputs: tuple[str, ...] = ()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def variant(
    name: str,
    mode: Mode,
    port: int,
    upstream: tuple[str, int],
    spec: FilterSpec | None = None,
    *,
    listener_tls: Mapping[str, Any] | None = None,
    cluster_tls: Mapping[str, Any] | None = None,
) -> Variant:
    """A listener on ``127.0.0.1:port`` in ``mode`` with ``spec``'s filters, forwarding to ``upstream``.

    Built from the profiler's own sidecar config (:func:`~meshtax.testbed.envoy.config.bootstrap`
    of the inbound side), so a variant's work is exactly the profiled sidecar's plus its filters.
    """
    cfg = EnvoyConfig(
        mode=mode,
        listen_address=LO,
        inbound_port=port,
        inbound_upstream=upstream,
        inbound_tls=listener_tls,
    )
    if spec is not None:
        cfg = spec.apply(cfg)
    boot = bootstrap(cfg)
    listener = next(x for x in boot["static_resources"]["listeners"] if x["name"] == "inbound")
    cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "inbound_static")
    cname = f"c_{_slug(name)}"
    # the cluster name appears only as a JSON string value: rename it everywhere at once
    text = json.dumps(listener).replace('"inbound_static"', json.dumps(cname))
    lst = json.loads(text)
    lst["name"] = f"l_{_slug(name)}"
    cl = json.loads(json.dumps(cluster))
    cl["name"] = cname
    cl["load_assignment"]["cluster_name"] = cname
    if cluster_tls is not None:
        cl["transport_socket"] = json.loads(json.dumps(cluster_tls))
    return Variant(name, port, lst, cl, spec.outputs if spec is not None else ())


def multi_bootstrap(variants: Sequence[Variant], admin_port: int) -> dict[str, Any]:
    """One bootstrap serving every variant (names and ports must be distinct)."""
    names = [v.name for v in variants]
    ports = [v.port for v in variants]
    if len(set(names)) != len(names) or len(set(ports)) != len(ports) or admin_port in ports:
        raise ValueError("variant names and ports (and the admin port) must be distinct")
    return {
        "node": {"id": "meshtax-filterprof", "cluster": "meshtax"},
        "admin": {"address": {"socket_address": {"address": LO, "port_value": admin_port}}},
        "static_resources": {
            "listeners": [dict(v.listener) for v in variants],
            "clusters": [dict(v.cluster) for v in variants],
        },
    }


def resolve_filters(
    filters: str | Sequence[str] | None, modes: Sequence[Mode]
) -> dict[Mode, list[str]]:
    """Component names to profile per mode: ``"all"`` is the whole catalogue; names may be
    bare filters (``rbac_http`` = every size) or sized components (``rbac_http_1000``)."""
    if filters is None:
        return {m: [] for m in modes}
    wanted: list[str] = []
    if filters == "all":
        wanted = [component_name(f, p) for f, p in catalogue()]
    else:
        for f in [filters] if isinstance(filters, str) else filters:
            try:
                parse_component(f)
                wanted.append(f)
            except ValueError:
                sized = [component_name(b, p) for b, p in catalogue() if b == f]
                if not sized:
                    raise ValueError(f"unknown filter {f!r}") from None
                wanted.extend(sized)
    return {
        m: [c for c in dict.fromkeys(wanted) if m in modes_for(parse_component(c)[0])]
        for m in modes
    }


def filter_variants(
    mode: Mode,
    components: Sequence[str],
    ports: Sequence[int],
    echo: tuple[str, int],
    *,
    combos: Mapping[str, Sequence[str]] | None = None,
    outdir: Path | None = None,
    params: Mapping[str, Any] | None = None,
) -> list[Variant]:
    """``base``, then one variant per component, then one per combination (``ports`` in order).

    ``outdir``: where tap and access-log files go (else the catalogue's defaults under /tmp).
    ``params``: extra filter parameters (e.g. ``module=`` bytes for wasm).
    """
    extra = dict(params or {})
    if outdir is not None:
        extra.setdefault("path_prefix", str(outdir / "tap" / "tap"))
        extra.setdefault("path", str(outdir / "access.log"))
    combos = dict(combos or {})
    need = 1 + len(components) + len(combos)
    if len(ports) < need:
        raise ValueError(f"need {need} ports, got {len(ports)}")
    out = [variant(BASE, mode, ports[0], echo)]
    for i, c in enumerate(components, 1):
        base, sized = parse_component(c)
        own = {k: v for k, v in extra.items() if k in _own_params(base)}
        out.append(variant(c, mode, ports[i], echo, filter_config(base, mode, **own, **sized)))
    for j, (name, members) in enumerate(combos.items(), 1 + len(components)):
        out.append(variant(name, mode, ports[j], echo, combination(members, mode, name, **extra)))
    return out


def _own_params(base: str) -> frozenset[str]:
    from meshtax.testbed.envoy.filters import _PARAMS

    return _PARAMS[base]


# ---- the process ---------------------------------------------------------------------------


def worker_cpu_ns(pid: int, proc: Path = Path("/proc")) -> int:
    """On-CPU ns of ``pid``'s Envoy worker threads (``wrk:worker_*``); all threads if none is
    named so (an Envoy under valgrind has renamed threads)."""
    total, seen = 0, False
    every = 0
    for t in (proc / str(pid) / "task").iterdir():
        try:
            comm = (t / "comm").read_text().strip()
            ns = parse_schedstat((t / "schedstat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue
        every += ns
        if comm.startswith("wrk:worker"):
            total += ns
            seen = True
    return total if seen else every


_TOTALS = re.compile(r"^totals:\s*(\d+)", re.M)
_SUMMARY = re.compile(r"^summary:\s*(\d+)", re.M)


def parse_callgrind_total(text: str) -> int:
    """Instructions (Ir) of one callgrind dump: its ``totals:`` line (written last, complete),
    else its ``summary:`` header."""
    m = _TOTALS.search(text) or _SUMMARY.search(text)
    if m is None:
        raise EnvoyError("callgrind dump has no totals/summary line")
    return int(m.group(1))


class MultiEnvoy:
    """One Envoy serving a multi-variant bootstrap, optionally under callgrind; a context manager."""

    def __init__(
        self,
        system: System,
        boot: Mapping[str, Any],
        workdir: Path,
        *,
        callgrind: bool = False,
        place: Placement = Placement(),
        binary: Path | None = None,
        start_timeout: float | None = None,
    ) -> None:
        self.system = system
        self.boot = boot
        self.workdir = workdir
        self.callgrind = callgrind
        self.place = place
        self.binary = binary or envoy_binary()
        self.start_timeout = start_timeout or (CALLGRIND_START_S if callgrind else 60.0)
        self.admin_port = int(boot["admin"]["address"]["socket_address"]["port_value"])
        self.process: Process | None = None
        self._log: IO[bytes] | None = None
        self._dumps = 0

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def argv(self, config: Path) -> list[str]:
        envoy = [
            str(self.binary),
            "-c",
            str(config),
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
        ]
        if not self.callgrind:
            return envoy
        # instructions only (no cache sim, no per-instruction dump): the cheapest callgrind
        return [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={self.workdir}/cg.out",
            "--dump-instr=no",
            "--collect-jumps=no",
            *envoy,
        ]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "envoy.json"
        config.write_text(json.dumps(self.boot, sort_keys=True))
        self._log = open(self.workdir / "envoy.log", "wb")  # noqa: SIM115
        self.process = self.system.spawn(
            self.argv(config), place=self.place, stderr=self._log, stdout=self._log
        )
        deadline = time.monotonic() + self.start_timeout
        while not self._ready():
            code = self.process.poll()
            if code is not None:
                raise EnvoyError(f"Envoy exited {code} at start: {self._tail()}")
            if time.monotonic() >= deadline:
                self.stop()
                raise EnvoyError(f"Envoy not LIVE after {self.start_timeout:.0f}s: {self._tail()}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        argv = ["curl", "-sS", "--fail", "--max-time", "1", f"http://{LO}:{self.admin_port}/ready"]
        try:
            return (
                self.system.run(
                    argv, place=Placement(netns=self.place.netns), timeout=10
                ).stdout.strip()
                == "LIVE"
            )
        except CommandError:
            return False

    def _tail(self) -> str:
        p = self.workdir / "envoy.log"
        return (
            " | ".join(p.read_text(errors="replace").strip().splitlines()[-5:])
            if p.exists()
            else ""
        )

    def zero(self) -> None:
        """Zero callgrind's counters (the start of a counted window)."""
        self.system.run(["callgrind_control", "-z", str(self.pid)], timeout=60)

    def dump(self) -> int:
        """Dump callgrind's counters since the last zero/dump; returns the instruction count."""
        self.system.run(["callgrind_control", "-d", str(self.pid)], timeout=60)
        self._dumps += 1
        path = self.workdir / f"cg.out.{self._dumps}"
        deadline = time.monotonic() + 30
        while not path.exists() or "totals:" not in path.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise EnvoyError(f"callgrind wrote no dump {path}")
            time.sleep(0.1)
        return parse_callgrind_total(path.read_text(errors="replace"))

    def stop(self) -> int | None:
        code = self.process.stop(timeout=30) if self.process is not None else None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def __enter__(self) -> MultiEnvoy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- measuring ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterRunOptions:
    """How hard to measure. ``rounds`` alternating runs of ``n`` requests per variant and size;
    callgrind windows of ``cg_n1`` and ``cg_n2`` requests after ``cg_warmup``."""

    sizes: tuple[int, ...] = (100,)
    rounds: int = 7
    n: int = 2000
    warmup_n: int = 300
    callgrind: bool = True
    cg_warmup: int = 200
    cg_n1: int = 200
    cg_n2: int = 1000
    # equal time per run: a variant slower per request than base gets n × (base / variant)
    # requests (at least min_n), from the warm-up's mean latency; a 10 000-rule RBAC run then
    # lasts as long as a base run instead of 20× longer, so more rounds fit in the same time
    equal_time: bool = False
    min_n: int = 100
    # paired blocks only: the client on CPU 0, Envoy and the echo app on CPU 1 (the
    # profiler's placement); unpinned, which core fortio lands on moves Envoy's CPU per request
    pin: bool = False

    @classmethod
    def quick(cls) -> FilterRunOptions:
        return cls(rounds=5, n=1000, warmup_n=200, cg_warmup=100, cg_n1=100, cg_n2=500)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class VariantSamples:
    """Per-request CPU (µs, worker thread) and mean latency (µs) per round; instructions."""

    cpu_us: list[float] = field(default_factory=list)
    latency_us: list[float] = field(default_factory=list)
    instructions: float | None = None
    # the base run paired with each of this variant's runs (adjacent in time)
    base_cpu_us: list[float] = field(default_factory=list)
    base_latency_us: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu_us": self.cpu_us,
            "latency_us": self.latency_us,
            "instructions": self.instructions,
            "base_cpu_us": self.base_cpu_us,
            "base_latency_us": self.base_latency_us,
        }


LoadFn = Callable[[str, Mode, int, int], LoadResult]  # (host:port, mode, size, n) → result


@dataclass
class FilterBackends:
    """Tools, injectable for tests; the defaults are the real ones."""

    cpu_ns: Callable[[int], int] = worker_cpu_ns
    load: LoadFn | None = None
    envoy: Callable[..., MultiEnvoy] = MultiEnvoy
    free_ports: Callable[[int], list[int]] | None = None
    clock: Callable[[], float] = time.monotonic
    callgrind_available: Callable[[], bool] = field(
        default=lambda: shutil.which("valgrind") is not None
    )
    echo: Callable[[System, Path, Mode, int], Any] | None = None  # a context manager (the app)


def echo_server(
    system: System, workdir: Path, mode: Mode, port: int, place: Placement = Placement()
) -> FortioServer:
    """A fortio echo app for ``mode`` on ``127.0.0.1:port``."""
    return FortioServer(
        system,
        workdir,
        host=LO,
        http_port=port if mode is Mode.HTTP else None,
        grpc_port=port if mode is Mode.GRPC else None,
        tcp_port=port if mode is Mode.TCP else None,
        place=place,
    )


def free_ports(k: int) -> list[int]:
    """``k`` distinct free loopback ports (held together while chosen, so they differ)."""
    socks = [socket.socket() for _ in range(k)]
    try:
        for s in socks:
            s.bind((LO, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def steady_per_request(i1: float, n1: int, i2: float, n2: int) -> float:
    """Per-request count from two windows of ``n1`` < ``n2`` requests: fixed work cancels."""
    if n2 <= n1:
        raise ValueError("need n2 > n1")
    return (i2 - i1) / (n2 - n1)


@dataclass
class ModeRun:
    """Everything measured in one mode: samples per size and variant, and how."""

    mode: Mode
    samples: dict[int, dict[str, VariantSamples]]
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "wall_s": self.wall_s,
            "samples": {
                str(s): {v: x.to_dict() for v, x in d.items()} for s, d in self.samples.items()
            },
        }


def measure_variants(
    mode: Mode,
    variants: Sequence[Variant],
    opts: FilterRunOptions,
    system: System,
    workdir: Path,
    be: FilterBackends,
    progress: Callable[[str], None] | None = None,
    admin_port: int | None = None,
) -> ModeRun:
    """Alternating CPU/latency rounds in one Envoy, then (optionally) callgrind in another."""
    t0 = be.clock()
    load = be.load or real_load(system)
    admin = admin_port if admin_port is not None else (be.free_ports or free_ports)(1)[0]
    boot = multi_bootstrap(variants, admin)
    for v in variants:
        for o in v.outputs:
            Path(o).parent.mkdir(parents=True, exist_ok=True)
    out: dict[int, dict[str, VariantSamples]] = {
        s: {v.name: VariantSamples() for v in variants} for s in opts.sizes
    }
    say = progress or (lambda _m: None)
    with be.envoy(system, boot, workdir / f"{mode.value}-cpu") as env:
        for size in opts.sizes:
            warm = {
                v.name: load(f"{LO}:{v.port}", mode, size, opts.warmup_n).avg_us for v in variants
            }
            base, others = variants[0], variants[1:]
            n_of = {v.name: run_length(opts, warm[BASE], warm[v.name]) for v in variants}

            def run(v: Variant) -> tuple[float, float]:
                c0 = be.cpu_ns(env.pid)
                res = load(f"{LO}:{v.port}", mode, size, n_of[v.name])  # noqa: B023
                c1 = be.cpu_ns(env.pid)
                return (c1 - c0) / 1e3 / res.count, res.avg_us

            for r in range(opts.rounds):
                say(f"{mode.value} {size} B: round {r + 1}/{opts.rounds}")
                k = r % max(len(others), 1)
                # each variant right next to its own base run (load on a shared machine
                # drifts within seconds); order within the pair and across variants rotates
                for v in [*others[k:], *others[:k]]:
                    pair = (base, v) if r % 2 == 0 else (v, base)
                    got = {p.name: run(p) for p in pair}
                    s = out[size][v.name]
                    s.cpu_us.append(got[v.name][0])
                    s.latency_us.append(got[v.name][1])
                    s.base_cpu_us.append(got[BASE][0])
                    s.base_latency_us.append(got[BASE][1])
                    out[size][BASE].cpu_us.append(got[BASE][0])
                    out[size][BASE].latency_us.append(got[BASE][1])
    if opts.callgrind and be.callgrind_available():
        say(f"{mode.value}: starting Envoy under callgrind")
        with be.envoy(system, boot, workdir / f"{mode.value}-callgrind", callgrind=True) as env:
            for size in opts.sizes:
                for v in variants:
                    say(f"{mode.value} {size} B: instructions of {v.name}")
                    target = f"{LO}:{v.port}"
                    load(target, mode, size, opts.cg_warmup)
                    env.zero()
                    load(target, mode, size, opts.cg_n1)
                    i1 = env.dump()
                    load(target, mode, size, opts.cg_n2)
                    i2 = env.dump()
                    out[size][v.name].instructions = steady_per_request(
                        i1, opts.cg_n1, i2, opts.cg_n2
                    )
    return ModeRun(mode, out, be.clock() - t0)


def run_length(opts: FilterRunOptions, base_us: float, variant_us: float) -> int:
    """Requests per run of a variant whose warm-up mean latency is ``variant_us`` (base:
    ``base_us``): ``opts.n``, or with ``equal_time`` scaled down to last as long as base."""
    if not opts.equal_time or variant_us <= base_us or base_us <= 0:
        return opts.n
    return max(min(opts.min_n, opts.n), round(opts.n * base_us / variant_us))


def real_load(system: System, *, stdclient: bool = False, place: Placement = Placement()) -> LoadFn:
    """fortio closed-loop runs of n requests (the default :attr:`FilterBackends.load`).

    ``stdclient``: Go's standard HTTP client; fortio's fast client fails every other request
    with bodies above ~64 KiB (seen with fortio 1.68.2, with and without a sidecar), so the
    large-message sweep uses it at every size (one client for the whole curve).
    """
    binary = fortio_binary()
    extra = ("-stdclient",) if stdclient else ()

    def load(target: str, mode: Mode, size: int, n: int) -> LoadResult:
        spec = LoadSpec(
            target,
            mode,
            size,
            0.0,
            n=n,
            timeout_s=30.0,
            extra_args=extra if mode is Mode.HTTP else (),
        )
        return run_spec(spec, system, binary=binary, place=place)

    return load


# ---- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterMeasurement:
    """One component (or combination) against ``base`` at one size, per request through one
    sidecar: CPU and latency differences with 95 % intervals, instructions and % over base."""

    name: str
    mode: Mode
    size: int
    cpu_us: Estimate
    latency_us: Estimate
    base_cpu_us: float
    base_latency_us: float
    instructions: float | None = None
    base_instructions: float | None = None

    @property
    def cpu_pct(self) -> float:
        return 100 * self.cpu_us.median / self.base_cpu_us if self.base_cpu_us else float("nan")

    @property
    def instructions_pct(self) -> float | None:
        if self.instructions is None or not self.base_instructions:
            return None
        return 100 * self.instructions / self.base_instructions

    @property
    def cpu_from_instructions_us(self) -> float | None:
        """Instructions × the base's measured µs per instruction (same process, same mode)."""
        if self.instructions is None or not self.base_instructions:
            return None
        return self.instructions * self.base_cpu_us / self.base_instructions

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode.value,
            "size": self.size,
            "cpu_us_per_request": self.cpu_us.to_dict(),
            "latency_us_per_request": self.latency_us.to_dict(),
            "base_cpu_us_per_request": self.base_cpu_us,
            "base_latency_us_per_request": self.base_latency_us,
            "cpu_pct_over_base": self.cpu_pct,
            "instructions_per_request": self.instructions,
            "base_instructions_per_request": self.base_instructions,
            "instructions_pct_over_base": self.instructions_pct,
            "cpu_us_from_instructions": self.cpu_from_instructions_us,
        }


def differences(run: ModeRun) -> dict[int, dict[str, FilterMeasurement]]:
    """Every non-base variant minus base, round by round (rounds are paired in time)."""
    out: dict[int, dict[str, FilterMeasurement]] = {}
    for size, by in run.samples.items():
        b = by[BASE]
        out[size] = {}
        for name, s in by.items():
            if name == BASE:
                continue
            dc = [x - y for x, y in zip(s.cpu_us, s.base_cpu_us)]
            dl = [x - y for x, y in zip(s.latency_us, s.base_latency_us)]
            di = (
                None
                if s.instructions is None or b.instructions is None
                else s.instructions - b.instructions
            )
            out[size][name] = FilterMeasurement(
                name,
                run.mode,
                size,
                estimate(dc),
                estimate(dl),
                median(b.cpu_us),
                median(b.latency_us),
                di,
                b.instructions,
            )
    return out


def filter_models(run: ModeRun) -> dict[str, ComponentModel]:
    """Per component, latency and CPU models per crossing (per-request differences halved),
    fitted on every round at every size, so their standard errors carry the spread."""
    models: dict[str, ComponentModel] = {}
    names = [n for n in next(iter(run.samples.values())) if n != BASE and parse_ok(n)]
    for name in names:
        sizes: list[float] = []
        cpu: list[float] = []
        lat: list[float] = []
        for size, by in run.samples.items():
            b, s = by[BASE], by[name]
            scaled = s.instructions is not None and bool(b.instructions)
            for x, y in zip(s.cpu_us, s.base_cpu_us):
                sizes.append(size)
                if scaled and s.instructions is not None and b.instructions:
                    # instructions are the robust signal; the paired base run gives its µs each
                    cpu.append((s.instructions - b.instructions) * (y / b.instructions) / 2)
                else:
                    cpu.append((x - y) / 2)
            lat += [(x - y) / 2 for x, y in zip(s.latency_us, s.base_latency_us)]
        how = (
            "CPU = callgrind instructions (filter − base) × base worker µs per instruction of each round"
            if cpu_source(run, name) == "instructions"
            else "CPU = worker thread schedstat difference"
        )
        note = "filter minus base in one Envoy, paired alternating runs; per request halved (2 crossings)"
        models[name] = ComponentModel(
            latency=CostModel.fit(sizes, lat, note=note + "; latency = fortio mean difference"),
            cpu=CostModel.fit(sizes, cpu, note=f"{note}; {how}"),
        )
    return models


def cpu_source(run: ModeRun, name: str) -> str:
    """``instructions`` when every size of ``name`` and base has callgrind counts, else ``schedstat``."""
    ok = all(
        by[name].instructions is not None and by[BASE].instructions for by in run.samples.values()
    )
    return "instructions" if ok else "schedstat"


def parse_ok(name: str) -> bool:
    """Is ``name`` a single catalogue component (not a combination)?"""
    try:
        parse_component(name)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class AdditivityRow:
    """A combination: the sum of its members' measured costs against its own measured cost.

    Two comparisons, both per request through one sidecar (worker thread CPU):

    * **total** (the paper's Fig. 9, Sahu et al.): predicted = base + Σ single-filter
      increments, against the measured CPU of the sidecar with the chain
      (:attr:`total_error`); per round too, with each run's adjacent base
      (:attr:`total_error_rounds`, a median with its 95 % interval);
    * **increment**: Σ single-filter increments against the chain's increment over base
      (:attr:`increment_error`); dominated by noise when the filters are small.
    """

    name: str
    mode: Mode
    size: int
    members: tuple[str, ...]
    predicted_cpu_us: float  # Σ member increments (medians of paired differences)
    measured_cpu_us: Estimate  # the chain's increment over base, paired
    predicted_instructions: float | None
    measured_instructions: float | None
    base_cpu_us: float = 0.0  # median of every base run at this size
    measured_total_cpu_us: Estimate | None = None  # the chain's own runs
    total_error_rounds: Estimate | None = None
    base_instructions: float | None = None

    @property
    def cpu_error(self) -> float:
        """Error on the increment (kept under its first name)."""
        m = self.measured_cpu_us.median
        return (self.predicted_cpu_us - m) / m if m else float("inf")

    @property
    def increment_error(self) -> float:
        return self.cpu_error

    @property
    def predicted_total_cpu_us(self) -> float:
        return self.base_cpu_us + self.predicted_cpu_us

    @property
    def total_error(self) -> float | None:
        if self.measured_total_cpu_us is None or not self.measured_total_cpu_us.median:
            return None
        return self.predicted_total_cpu_us / self.measured_total_cpu_us.median - 1

    @property
    def instructions_error(self) -> float | None:
        if self.predicted_instructions is None or not self.measured_instructions:
            return None
        return (
            self.predicted_instructions - self.measured_instructions
        ) / self.measured_instructions

    @property
    def total_instructions_error(self) -> float | None:
        """As :attr:`instructions_error`, on base + Σ increments vs the chain's total."""
        if (
            self.predicted_instructions is None
            or self.measured_instructions is None
            or not self.base_instructions
        ):
            return None
        return (self.base_instructions + self.predicted_instructions) / (
            self.base_instructions + self.measured_instructions
        ) - 1

    def to_dict(self) -> dict[str, Any]:
        t, tr = self.measured_total_cpu_us, self.total_error_rounds
        return {
            "name": self.name,
            "mode": self.mode.value,
            "size": self.size,
            "members": list(self.members),
            "base_cpu_us": self.base_cpu_us,
            "predicted_total_cpu_us": self.predicted_total_cpu_us,
            "measured_total_cpu_us": None if t is None else t.to_dict(),
            "total_error": self.total_error,
            "total_error_rounds": None if tr is None else tr.to_dict(),
            "predicted_cpu_us": self.predicted_cpu_us,
            "measured_cpu_us": self.measured_cpu_us.to_dict(),
            "cpu_error": self.cpu_error,
            "increment_error": self.increment_error,
            "predicted_instructions": self.predicted_instructions,
            "measured_instructions": self.measured_instructions,
            "instructions_error": self.instructions_error,
            "base_instructions": self.base_instructions,
            "total_instructions_error": self.total_instructions_error,
        }


def total_errors_by_round(
    by: Mapping[str, VariantSamples], name: str, members: Sequence[str]
) -> list[float]:
    """Per round r: (base_r + Σ Δ_i,r) / chain_r − 1, where base_r is the base run adjacent to
    the chain's run and Δ_i,r each member's paired difference in the same round."""
    c = by[name]
    rounds = min([len(c.cpu_us)] + [len(by[m].cpu_us) for m in members])
    out = []
    for r in range(rounds):
        pred = c.base_cpu_us[r] + sum(by[m].cpu_us[r] - by[m].base_cpu_us[r] for m in members)
        if c.cpu_us[r]:
            out.append(pred / c.cpu_us[r] - 1)
    return out


def additivity(run: ModeRun, combos: Mapping[str, Sequence[str]]) -> list[AdditivityRow]:
    """Predicted (base + sum of single-filter differences) vs measured, per combination and size."""
    rows = []
    for size, diffs in differences(run).items():
        by = run.samples[size]
        for name, members in combos.items():
            if name not in diffs or any(m not in diffs for m in members):
                continue
            insts = [diffs[m].instructions for m in members]
            pred_i = (
                None if any(i is None for i in insts) else sum(i for i in insts if i is not None)
            )
            errs = total_errors_by_round(by, name, members)
            rows.append(
                AdditivityRow(
                    name,
                    run.mode,
                    size,
                    tuple(members),
                    sum(diffs[m].cpu_us.median for m in members),
                    diffs[name].cpu_us,
                    pred_i,
                    diffs[name].instructions,
                    base_cpu_us=median(by[BASE].cpu_us),
                    measured_total_cpu_us=estimate(by[name].cpu_us),
                    total_error_rounds=estimate(errs) if errs else None,
                    base_instructions=by[BASE].instructions,
                )
            )
    return rows


def combos_for(mode: Mode, components: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The paper's combinations and the RBAC/IP-tag mixes whose members are all measured."""
    have = set(components)
    return {
        k: v
        for k, v in {**COMBINATIONS, **MIXES}.items()
        if set(v) <= have and all(mode in modes_for(parse_component(c)[0]) for c in v)
    }


def profile_filters(
    mode: Mode,
    components: Sequence[str],
    opts: FilterRunOptions,
    system: System,
    *,
    combos: Mapping[str, Sequence[str]] | None = None,
    backends: FilterBackends | None = None,
    workdir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> ModeRun:
    """Measure ``components`` (and ``combos``) against base in ``mode`` on loopback, with a
    fortio echo app started for the run; tap/access-log output is removed afterwards."""
    be = backends or FilterBackends()
    combos = dict(combos or {})
    tmp = Path(tempfile.mkdtemp(prefix="meshtax-filterprof-")) if workdir is None else workdir
    try:
        ports = (be.free_ports or free_ports)(2 + len(components) + len(combos))
        echo_port, vports = ports[0], ports[1:]
        variants = filter_variants(
            mode, components, vports, (LO, echo_port), combos=combos, outdir=tmp / "out"
        )
        with (be.echo or echo_server)(system, tmp / "echo", mode, echo_port):
            return measure_variants(mode, variants, opts, system, tmp, be, progress)
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def additivity_components() -> list[str]:
    """The single components the paper's combinations and the RBAC/IP-tag mixes are made of."""
    return list(dict.fromkeys(c for v in (*COMBINATIONS.values(), *MIXES.values()) for c in v))


# ---- per connection --------------------------------------------------------------------------

ConnectFn = Callable[[int, int, Mode], float]  # (port, k connections, mode) → mean s per connection

_LINE = b"meshtax-connect\n"
_GET = b"GET /echo HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n"


def connect_loop(port: int, k: int, mode: Mode = Mode.TCP) -> float:
    """Open ``k`` connections to ``127.0.0.1:port`` one after another, one message each:
    TCP: send a line, read it back, close; HTTP: one ``Connection: close`` GET, read to EOF;
    gRPC: HTTP/2 with prior knowledge, one unary ``fgrpc.PingServer/Ping`` call to fortio's
    ping service (its payload must come back), then GOAWAY and close. Returns the mean
    seconds per connection."""
    t0 = time.perf_counter()
    for _ in range(k):
        with socket.create_connection((LO, port), timeout=5) as s:
            if mode is Mode.GRPC:
                grpc_ping(s, port)
            elif mode is Mode.TCP:
                s.sendall(_LINE)
                got = b""
                while len(got) < len(_LINE):
                    chunk = s.recv(4096)
                    if not chunk:
                        raise ConnectionError(f"connection to {port} closed after {len(got)} bytes")
                    got += chunk
            else:
                s.sendall(_GET)
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
                if not got.startswith(b"HTTP/1.1 200"):
                    raise ConnectionError(f"{port}: {got[:40]!r}")
    return (time.perf_counter() - t0) / k


# ---- one unary gRPC call per connection (HTTP/2 by the h2 library) ---------------------------

GRPC_PING_PAYLOAD = b"meshtax-connect"


def grpc_ping_message() -> bytes:
    """fortio's ``PingMessage{payload}`` as one gRPC length-prefixed, uncompressed message."""
    msg = b"\x1a" + bytes([len(GRPC_PING_PAYLOAD)]) + GRPC_PING_PAYLOAD  # field 3, bytes
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


def grpc_ping(s: socket.socket, port: int) -> None:
    """One unary gRPC Ping on a fresh connection ``s`` (HTTP/2 with prior knowledge); returns
    when the stream ends with the payload echoed, raises :class:`ConnectionError` on a reset,
    GOAWAY, early close or missing payload; closes with GOAWAY."""
    conn = H2Connection(H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/fgrpc.PingServer/Ping"),
            (":authority", "app"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ],
    )
    conn.send_data(1, grpc_ping_message(), end_stream=True)
    s.sendall(conn.data_to_send())
    data = b""
    ended = False
    while not ended:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"{port}: HTTP/2 connection closed before the response ended")
        for ev in conn.receive_data(chunk):
            if isinstance(ev, h2events.DataReceived):
                data += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2events.StreamReset):
                raise ConnectionError(f"{port}: HTTP/2 RST_STREAM before the response")
            elif isinstance(ev, h2events.ConnectionTerminated):
                raise ConnectionError(f"{port}: HTTP/2 GOAWAY before the response")
            elif isinstance(ev, h2events.StreamEnded):
                ended = True
        s.sendall(conn.data_to_send())  # SETTINGS/PING acknowledgements, window updates
    if GRPC_PING_PAYLOAD not in data:
        raise ConnectionError(
            f"{port}: gRPC call ended without the echoed payload (status in trailers)"
        )
    conn.close_connection()
    s.sendall(conn.data_to_send())


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
    mode: Mode,
    components: Sequence[str],
    opts: FilterRunOptions,
    system: System,
    *,
    backends: FilterBackends | None = None,
    connect: ConnectFn = connect_loop,
    k: int = 200,
    workdir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, ConnectionMeasurement]:
    """Per new connection: each component against base in one Envoy (any mode: see :func:`connect_loop`),
    ``opts.rounds`` paired rounds of ``k`` connections, order alternating and rotating."""
    be = backends or FilterBackends()
    say = progress or (lambda _m: None)
    tmp = Path(tempfile.mkdtemp(prefix="meshtax-connprof-")) if workdir is None else workdir
    samples: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {
        c: ([], [], [], []) for c in components
    }
    try:
        ports = (be.free_ports or free_ports)(3 + len(components))
        echo_port, admin, vports = ports[0], ports[1], ports[2:]
        variants = filter_variants(mode, components, vports, (LO, echo_port), outdir=tmp / "out")
        base, others = variants[0], variants[1:]
        with (
            (be.echo or echo_server)(system, tmp / "echo", mode, echo_port),
            be.envoy(system, multi_bootstrap(variants, admin), tmp / f"conn-{mode.value}") as env,
        ):
            for v in variants:
                connect(v.port, 20, mode)  # warm: the first connections pay for lazy set-up
            for r in range(opts.rounds):
                say(f"{mode.value}: per connection, round {r + 1}/{opts.rounds}")
                j = r % max(len(others), 1)
                for v in [*others[j:], *others[:j]]:
                    got = {}
                    for x in (base, v) if r % 2 == 0 else (v, base):
                        c0 = be.cpu_ns(env.pid)
                        t = connect(x.port, k, mode)
                        got[x.name] = ((be.cpu_ns(env.pid) - c0) / 1e3 / k, t * 1e6)
                    dc, dl, bc, bl = samples[v.name]
                    dc.append(got[v.name][0] - got[BASE][0])
                    dl.append(got[v.name][1] - got[BASE][1])
                    bc.append(got[BASE][0])
                    bl.append(got[BASE][1])
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {
        c: ConnectionMeasurement(c, mode, k, estimate(dc), estimate(dl), median(bc), median(bl))
        for c, (dc, dl, bc, bl) in samples.items()
        if dc
    }


# ---- additivity in paired blocks -----------------------------------------------------------
#
# The round design above pairs each variant with its own base, but a combination and its
# members are measured up to minutes apart within a round, and on this shared machine a
# base run's CPU per request moves by 2× within seconds. A *block* runs, for one
# combination, base, every member and the chain back to back (seconds in all), in a
# palindrome: every variant twice, the second pass mirrored, so each variant's mean run time
# is the block's centre and a drift linear in time over the block cancels exactly. The error
# of that block compares the chain with its own members and base; the additivity result is
# the median of the per-block errors with its 95 % interval.


def block_order(names: Sequence[str], r: int) -> list[str]:
    """``names`` rotated by ``r``, then mirrored: ``[a, b, c]``, r=1 → ``b c a a c b``."""
    if not names:
        return []
    k = r % len(names)
    rot = [*names[k:], *names[:k]]
    return [*rot, *reversed(rot)]


@dataclass(frozen=True)
class Block:
    """One paired round of one combination (see :func:`block_order`): per variant its runs'
    worker CPU per request (µs) in run order; ``t_start``/``t_end`` in Unix seconds."""

    combo: str
    members: tuple[str, ...]
    round: int
    cpu_us: Mapping[str, tuple[float, ...]]
    t_start: float = 0.0
    t_end: float = 0.0

    def mean(self, name: str) -> float:
        xs = self.cpu_us[name]
        return sum(xs) / len(xs)

    @property
    def base_us(self) -> float:
        return self.mean(BASE)

    @property
    def chain_us(self) -> float:
        return self.mean(self.combo)

    @property
    def predicted_us(self) -> float:
        """Base + Σ (member − base), all from this block."""
        b = self.base_us
        return b + sum(self.mean(m) - b for m in self.members)

    @property
    def error(self) -> float:
        """Predicted total / measured chain − 1."""
        return self.predicted_us / self.chain_us - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "combo": self.combo,
            "members": list(self.members),
            "round": self.round,
            "cpu_us": {k: list(v) for k, v in self.cpu_us.items()},
            "t_start": self.t_start,
            "t_end": self.t_end,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Block:
        return cls(
            str(d["combo"]),
            tuple(d["members"]),
            int(d["round"]),
            {str(k): tuple(float(x) for x in v) for k, v in d["cpu_us"].items()},
            float(d.get("t_start", 0.0)),
            float(d.get("t_end", 0.0)),
        )


def measure_blocks(
    mode: Mode,
    variants: Sequence[Variant],
    combos: Mapping[str, Sequence[str]],
    opts: FilterRunOptions,
    system: System,
    workdir: Path,
    be: FilterBackends,
    *,
    budget_s: float | None = None,
    first_round: int = 0,
    progress: Callable[[str], None] | None = None,
    wall: Callable[[], float] = time.time,
    admin_port: int | None = None,
) -> list[Block]:
    """``opts.rounds`` rounds of one block per combination in one Envoy (first size only),
    stopping early before a block that would overrun ``budget_s`` (judged by the longest
    block so far). Rounds are numbered from ``first_round`` so chunks continue the rotation."""
    t0 = be.clock()
    load = be.load or real_load(system, place=CLIENT_CPU if opts.pin else Placement())
    by_name = {v.name: v for v in variants}
    admin = admin_port if admin_port is not None else (be.free_ports or free_ports)(1)[0]
    size = opts.sizes[0]
    say = progress or (lambda _m: None)
    blocks: list[Block] = []
    longest = 0.0
    boot = multi_bootstrap(variants, admin)
    pinned = {"place": SIDECAR_CPU} if opts.pin else {}
    with be.envoy(system, boot, workdir / f"{mode.value}-blocks", **pinned) as env:
        warm = {v.name: load(f"{LO}:{v.port}", mode, size, opts.warmup_n).avg_us for v in variants}
        n_of = {v.name: run_length(opts, warm[BASE], warm[v.name]) for v in variants}

        def run(name: str) -> float:
            c0 = be.cpu_ns(env.pid)
            res = load(f"{LO}:{by_name[name].port}", mode, size, n_of[name])
            return (be.cpu_ns(env.pid) - c0) / 1e3 / res.count

        names = list(combos)
        for r in range(first_round, first_round + opts.rounds):
            k = r % max(len(names), 1)
            for combo in [*names[k:], *names[:k]]:
                now = be.clock()
                if budget_s is not None and blocks and (now - t0) + longest > budget_s:
                    say(
                        f"{mode.value}: budget of {budget_s:.0f} s reached after {len(blocks)} blocks"
                    )
                    return blocks
                members = tuple(combos[combo])
                got: dict[str, list[float]] = {}
                ts = wall()
                for name in block_order([BASE, *members, combo], r):
                    got.setdefault(name, []).append(run(name))
                blocks.append(
                    Block(combo, members, r, {k2: tuple(v) for k2, v in got.items()}, ts, wall())
                )
                longest = max(longest, be.clock() - now)
            say(
                f"{mode.value}: round {r + 1 - first_round}/{opts.rounds}, {len(blocks)} blocks, "
                f"{be.clock() - t0:.0f} s"
            )
    return blocks


def profile_blocks(
    mode: Mode,
    combos: Mapping[str, Sequence[str]],
    opts: FilterRunOptions,
    system: System,
    *,
    budget_s: float | None = None,
    first_round: int = 0,
    backends: FilterBackends | None = None,
    workdir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Block]:
    """:func:`measure_blocks` with an echo app and one Envoy holding base, every member and
    every chain of ``combos``; tap/access-log output is removed afterwards."""
    be = backends or FilterBackends()
    comps = list(dict.fromkeys(c for v in combos.values() for c in v))
    tmp = Path(tempfile.mkdtemp(prefix="meshtax-blocks-")) if workdir is None else workdir
    try:
        # the admin port is chosen with the others: chosen apart, a port just released could
        # come back as the admin port (seen once: "variant names and ports … must be distinct")
        ports = (be.free_ports or free_ports)(3 + len(comps) + len(combos))
        echo_port, admin, vports = ports[0], ports[1], ports[2:]
        variants = filter_variants(
            mode, comps, vports, (LO, echo_port), combos=combos, outdir=tmp / "out"
        )
        for v in variants:
            for o in v.outputs:
                Path(o).parent.mkdir(parents=True, exist_ok=True)
        echo = (be.echo or echo_server)(
            system, tmp / "echo", mode, echo_port, *([SIDECAR_CPU] if opts.pin else [])
        )
        with echo:
            return measure_blocks(
                mode,
                variants,
                combos,
                opts,
                system,
                tmp,
                be,
                budget_s=budget_s,
                first_round=first_round,
                progress=progress,
                admin_port=admin,
            )
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class BlockRow:
    """A combination's additivity over its blocks: per-block base, predicted total, measured
    chain and error (predicted / chain − 1), each a median with its 95 % interval."""

    name: str
    members: tuple[str, ...]
    base_us: Estimate
    predicted_us: Estimate
    chain_us: Estimate
    error: Estimate
    increment_predicted_us: float  # median over blocks of Σ (member − base)
    increment_measured_us: float  # median over blocks of chain − base

    @property
    def blocks(self) -> int:
        return self.error.n

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "members": list(self.members),
            "blocks": self.blocks,
            "base_us": self.base_us.to_dict(),
            "predicted_total_us": self.predicted_us.to_dict(),
            "measured_total_us": self.chain_us.to_dict(),
            "error": self.error.to_dict(),
            "increment_predicted_us": self.increment_predicted_us,
            "increment_measured_us": self.increment_measured_us,
        }


def block_additivity(blocks: Sequence[Block]) -> list[BlockRow]:
    """One :class:`BlockRow` per combination, in first-seen order."""
    by: dict[str, list[Block]] = {}
    for b in blocks:
        by.setdefault(b.combo, []).append(b)
    rows = []
    for name, bs in by.items():
        rows.append(
            BlockRow(
                name,
                bs[0].members,
                estimate([b.base_us for b in bs]),
                estimate([b.predicted_us for b in bs]),
                estimate([b.chain_us for b in bs]),
                estimate([b.error for b in bs]),
                median([b.predicted_us - b.base_us for b in bs]),
                median([b.chain_us - b.base_us for b in bs]),
            )
        )
    return rows
