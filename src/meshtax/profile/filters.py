"""Filter profiling: every catalogue filter as its own component, by difference.

One Envoy per mode serves every variant at once, each on its own loopback listener with its
own filter chain in front of the same echo app: ``base`` (no filter), each single filter, and
(for the additivity study) each combination (:mod:`meshtax.profile.loopback`). Its one worker
thread serves them all, so "with minus without" compares the same process, the same thread,
the same mode and size, in runs paired in time (:func:`~meshtax.testbed.paired.paired_runs`:
each variant next to its own base run, the order alternating and rotating every round).

Two measures per variant:

* **CPU**: on-CPU ns of the worker thread (schedstat, user + kernel) over a closed-loop fortio
  run, per request; filter = variant − base, round by round, with a 95 % interval over rounds.
  Latency (fortio's mean) is differenced the same way.
* **Instructions** (optional, ``valgrind --tool=callgrind``): the same Envoy config under
  callgrind; counters are zeroed, ``n1`` then ``n2`` requests are sent and dumped, and
  ``(I(n2) − I(n1)) / (n2 − n1)`` is the steady-state instruction count per request (warm-up,
  connection set-up and per-run fixed work cancel). Deterministic to about 1 %, so it is the
  robust signal on a noisy machine.

Models land in a profile per crossing (one sidecar, one direction): a request and its response
are two crossings, so per-request costs are halved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.presets import PRESETS
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.backends import Backends
from meshtax.profile.loopback import VariantEnvoy, variant_envoy
from meshtax.testbed.envoy.filters import (
    COMBINATIONS,
    MIXES,
    catalogue,
    component_name,
    modes_for,
    parse_component,
)
from meshtax.testbed.envoy.variants import BASE, filter_variants
from meshtax.testbed.paired import Paired, PairPolicy, paired_runs
from meshtax.testbed.pods import Testbed

__all__ = [
    "FilterMeasurement",
    "FilterRunOptions",
    "ModeRun",
    "VariantSamples",
    "additivity_components",
    "combos_for",
    "cpu_source",
    "differences",
    "filter_models",
    "parse_ok",
    "profile_filters",
    "resolve_filters",
    "run_length",
    "steady_per_request",
]


def resolve_filters(
    filters: str | Sequence[str] | None, modes: Sequence[Mode]
) -> dict[Mode, list[str]]:
    """Component names to profile per mode: ``"all"`` is the whole catalogue; names may be
    bare filters (``rbac_http`` = every size), sized components (``rbac_http_1000``) or a
    preset (``istio-default``: its filters)."""
    if filters is None:
        return {m: [] for m in modes}
    wanted: list[str] = []
    if filters == "all":
        wanted = [component_name(f, p) for f, p in catalogue()]
    else:
        for f in [filters] if isinstance(filters, str) else filters:
            if f in PRESETS:  # istio-default: its stand-ins
                wanted.extend(PRESETS[f])
                continue
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


def profile_filters(
    tb: Testbed,
    be: Backends,
    mode: Mode,
    components: Sequence[str],
    opts: FilterRunOptions,
    *,
    combos: Mapping[str, Sequence[str]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ModeRun:
    """Paired CPU/latency rounds in one Envoy, then (optionally) callgrind in another."""
    t0 = be.clock()
    combos = dict(combos or {})
    n_variants = 1 + len(components) + len(combos)

    def build(ports: Sequence[int], echo: tuple[str, int], out: Any) -> list[Any]:
        return filter_variants(mode, components, ports, echo, combos=combos, outdir=out)

    names = [BASE, *components, *combos]
    samples = {s: {v: VariantSamples() for v in names} for s in opts.sizes}
    say = progress or (lambda _m: None)
    with variant_envoy(tb, be, mode, build, n_variants, label=f"filters-{mode.value}") as ve:
        for size in opts.sizes:
            warm = ve.warm(size, opts.warmup_n)
            n_of = {v: run_length(opts, warm[BASE], warm[v]) for v in names}
            say(f"{mode.value} {size} B: {opts.rounds} rounds of {len(names) - 1} variants")
            paired = _against_base(ve, names, size, n_of, opts.rounds, say)
            for g in paired.groups:
                v = g.group[1]
                (c, lat), (bc, bl) = g.first(v), g.first(BASE)
                s, b = samples[size][v], samples[size][BASE]
                s.cpu_us.append(c)
                s.latency_us.append(lat)
                s.base_cpu_us.append(bc)
                s.base_latency_us.append(bl)
                b.cpu_us.append(bc)
                b.latency_us.append(bl)
    if opts.callgrind and be.callgrind_available():
        say(f"{mode.value}: starting Envoy under callgrind")
        with variant_envoy(
            tb, be, mode, build, n_variants, label=f"callgrind-{mode.value}", callgrind=True
        ) as ve:
            for size in opts.sizes:
                for v in names:
                    say(f"{mode.value} {size} B: instructions of {v}")
                    samples[size][v].instructions = _instructions(ve, v, size, opts)
    return ModeRun(mode, samples, be.clock() - t0)


def _against_base(
    ve: VariantEnvoy,
    names: Sequence[str],
    size: int,
    n_of: Mapping[str, int],
    rounds: int,
    say: Callable[[str], None],
) -> Paired[tuple[float, float]]:
    """Each variant right next to its own base run (load on a shared machine drifts within
    seconds); the order within a pair alternates and the variants rotate every round."""
    return paired_runs(
        [(names[0], v) for v in names[1:]],
        lambda v: ve.run(v, size, n_of[v]),
        PairPolicy.fixed(rounds),
        progress=lambda m: say(f"{ve.mode.value} {size} B: {m}"),
    )


def _instructions(ve: VariantEnvoy, name: str, size: int, opts: FilterRunOptions) -> float:
    """Steady-state instructions per request of ``name`` (two counted windows)."""
    target = ve.target(name)
    ve.load(target, ve.mode, size, opts.cg_warmup)
    ve.env.zero()
    ve.load(target, ve.mode, size, opts.cg_n1)
    i1 = ve.env.dump()
    ve.load(target, ve.mode, size, opts.cg_n2)
    i2 = ve.env.dump()
    return steady_per_request(i1, opts.cg_n1, i2, opts.cg_n2)


def run_length(opts: FilterRunOptions, base_us: float, variant_us: float) -> int:
    """Requests per run of a variant whose warm-up mean latency is ``variant_us`` (base:
    ``base_us``): ``opts.n``, or with ``equal_time`` scaled down to last as long as base."""
    if not opts.equal_time or variant_us <= base_us or base_us <= 0:
        return opts.n
    return max(min(opts.min_n, opts.n), round(opts.n * base_us / variant_us))


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


def combos_for(mode: Mode, components: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The paper's combinations and the RBAC/IP-tag mixes whose members are all measured."""
    have = set(components)
    return {
        k: v
        for k, v in {**COMBINATIONS, **MIXES}.items()
        if set(v) <= have and all(mode in modes_for(parse_component(c)[0]) for c in v)
    }


def additivity_components() -> list[str]:
    """The single components the paper's combinations and the RBAC/IP-tag mixes are made of."""
    return list(dict.fromkeys(c for v in (*COMBINATIONS.values(), *MIXES.values()) for c in v))
