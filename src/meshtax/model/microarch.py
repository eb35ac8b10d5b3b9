"""The microarchitectural profile: instructions, cache misses and branches per request of the
sidecar proxy, per mode, variant (base, a filter, a chain of filters) and size (pure data).

Counts come from one of two sources, named in :attr:`Microarch.source`:

* ``valgrind``: ``valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes`` — simulated
  I1/D1/LL caches of the recorded :class:`CacheGeometry` and simulated branch predictors;
  deterministic up to what the program does differently run to run, so two runs agree;
* ``pmu``: the hardware counters (``perf stat``) of the machine, with cycles (so IPC) and a
  top-down split where the CPU has the events.

Events are stored under the source's own names (:attr:`CounterRow.per_request`);
:data:`METRICS` maps them to one vocabulary (``instructions``, ``i1_misses`` …) so tables and
comparisons read the same whatever the source.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "AGREEMENT_BOUNDS",
    "METRICS",
    "MIN_COUNT",
    "MICROARCH_FORMAT",
    "PUBLISHED_BRANCHES",
    "PUBLISHED_MICROARCH",
    "PUBLISHED_RATIOS",
    "SAHU",
    "TOPDOWN",
    "CacheGeometry",
    "CacheLevel",
    "CounterRow",
    "KernelRow",
    "Microarch",
    "metric",
]

#: Version of the ``microarch`` field of a profile document (bump with a dated note).
#: 1 — 2026-11-23: first format (issue #19).
#: 2 — 2026-11-26: a row keeps every window pair's estimate (``pairs``; ``per_request`` is
#: their median); ``main`` (the main thread) became ``background`` (every thread that serves
#: no request); format-1 rows load with one pair and their ``main`` as ``background``.
#: 3 — 2026-11-26: a row keeps the windows of every counting round (``rounds``: a row whose
#: pairs did not resolve a compared count within its bound is counted again with more
#: requests), the pairs of the rounds before the last (``earlier``) and the metrics still
#: unresolved after the last (``unresolved``); older rows load with one round (their own
#: windows), no earlier pairs and nothing unresolved.
MICROARCH_FORMAT = 3

#: metric → events summed, per source (a metric a source lacks is absent from its rows)
METRICS: dict[str, dict[str, tuple[str, ...]]] = {
    "instructions": {"valgrind": ("Ir",), "pmu": ("instructions",)},
    "cycles": {"pmu": ("cycles",)},
    "i1_misses": {"valgrind": ("I1mr",), "pmu": ("L1-icache-load-misses",)},
    "d1_misses": {"valgrind": ("D1mr", "D1mw"), "pmu": ("L1-dcache-load-misses",)},
    "ll_misses": {"valgrind": ("ILmr", "DLmr", "DLmw"), "pmu": ("LLC-load-misses",)},
    "branches": {"valgrind": ("Bc", "Bi"), "pmu": ("branches",)},
    "branch_misses": {"valgrind": ("Bcm", "Bim"), "pmu": ("branch-misses",)},
    "cond_branches": {"valgrind": ("Bc",)},
    "cond_misses": {"valgrind": ("Bcm",)},
    "indirect_branches": {"valgrind": ("Bi",)},
    "indirect_misses": {"valgrind": ("Bim",)},
    # the top-down level-1 split, in pipeline slots (perf's names; CPUs that have them)
    "slots": {"pmu": ("slots",)},
    "retiring": {"pmu": ("topdown-retiring",)},
    "bad_speculation": {"pmu": ("topdown-bad-spec",)},
    "frontend_bound": {"pmu": ("topdown-fe-bound",)},
    "backend_bound": {"pmu": ("topdown-be-bound",)},
}
#: the top-down categories, as shares of :data:`METRICS` ``slots``
TOPDOWN = ("retiring", "bad_speculation", "frontend_bound", "backend_bound")
#: two runs agree when these metrics per request are within these shares of each other:
#: instructions within 2 %, simulated misses within 5 % (issue #19)
AGREEMENT_BOUNDS: dict[str, float] = {
    "instructions": 0.02,
    "i1_misses": 0.05,
    "d1_misses": 0.05,
    "ll_misses": 0.05,
    "branch_misses": 0.05,
}
#: a count below this per request is not compared relatively (a few misses of a warm LL)
MIN_COUNT = 1.0


def metric(events: Mapping[str, float], source: str, name: str) -> float | None:
    """``name`` (a :data:`METRICS` key) from a source's events; None when the source or these
    events do not have it."""
    names = METRICS[name].get(source)
    if not names or any(e not in events for e in names):
        return None
    return float(sum(events[e] for e in names))


@dataclass(frozen=True)
class CacheLevel:
    """One simulated cache: ``size`` and ``line`` in bytes, ``assoc`` ways (1: direct-mapped;
    ``assoc == size // line``: fully associative)."""

    size: int
    assoc: int
    line: int

    def __post_init__(self) -> None:
        if min(self.size, self.assoc, self.line) <= 0 or self.size % (self.assoc * self.line):
            raise ValueError(f"cache geometry {self.size} B, {self.assoc}-way, {self.line} B lines")

    @property
    def sets(self) -> int:
        return self.size // (self.assoc * self.line)

    def arg(self) -> str:
        """valgrind's ``--I1``/``--D1``/``--LL`` value: ``size,assoc,line``."""
        return f"{self.size},{self.assoc},{self.line}"

    def describe(self) -> str:
        way = "direct-mapped" if self.assoc == 1 else f"{self.assoc}-way"
        return f"{self.size // 1024} KiB {way}, {self.line} B lines"

    def to_dict(self) -> dict[str, int]:
        return {"size": self.size, "assoc": self.assoc, "line": self.line}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CacheLevel:
        return cls(int(d["size"]), int(d["assoc"]), int(d["line"]))


@dataclass(frozen=True)
class CacheGeometry:
    """The simulated caches (as valgrind reports them in the dump); ``origin`` says where the
    geometry came from (``host`` caches given to valgrind, ``valgrind`` detection, ``given``)."""

    i1: CacheLevel
    d1: CacheLevel
    ll: CacheLevel
    origin: str = ""

    def describe(self) -> str:
        lv = f"I1 {self.i1.describe()}; D1 {self.d1.describe()}; LL {self.ll.describe()}"
        return f"{lv} ({self.origin})" if self.origin else lv

    def to_dict(self) -> dict[str, Any]:
        return {
            "i1": self.i1.to_dict(),
            "d1": self.d1.to_dict(),
            "ll": self.ll.to_dict(),
            "origin": self.origin,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CacheGeometry:
        return cls(
            CacheLevel.from_dict(d["i1"]),
            CacheLevel.from_dict(d["d1"]),
            CacheLevel.from_dict(d["ll"]),
            str(d.get("origin", "")),
        )


def _floats(d: Mapping[str, Any] | None) -> dict[str, float]:
    return {str(k): float(v) for k, v in (d or {}).items()}


@dataclass(frozen=True)
class CounterRow:
    """One variant of one mode at one size, counted in pairs of windows of ``n1`` < ``n2``
    requests after a warm-up window of ``warmup_n``.

    ``pairs``: each pair's steady-state events per request, ``(C(n2) − C(n1)) / (n2 − n1)``
    (fixed per-window work cancels); ``per_request``: their median, event by event.
    ``fixed``: per-window work apart from the requests (the load generator's connection
    set-up and close), ``C(n1) − n1 · per_request``. ``warmup``: what the first window of the
    variant cost beyond ``warmup_n`` steady requests and the fixed work (lazy initialisation,
    cold caches). ``members``: a chain's filters. ``by_part``: per-request events split into
    ``parsing``/``filters``/``other`` by function (empty when the proxy's symbols were not
    available). ``background``: per request, the events of the threads that serve no request
    (Envoy's main thread, watchdogs, gRPC timers: their work follows a window's wall time, not
    its requests; not in ``per_request``), when the source counts threads apart.
    ``rounds``: the (n1, n2) windows of every counting round, the last the row's own (a row
    whose pairs leave a compared count unresolved is counted again with more requests);
    ``earlier``: the pairs of the rounds before the last; ``unresolved``: the metrics the last
    round's pairs still do not resolve (:meth:`unresolved_by_pairs`).
    """

    mode: str
    variant: str
    size: int
    n1: int
    n2: int
    warmup_n: int
    per_request: Mapping[str, float]
    fixed: Mapping[str, float] = field(default_factory=dict)
    warmup: Mapping[str, float] = field(default_factory=dict)
    members: tuple[str, ...] = ()
    by_part: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    background: Mapping[str, float] = field(default_factory=dict)
    pairs: tuple[Mapping[str, float], ...] = ()
    rounds: tuple[tuple[int, int], ...] = ()
    unresolved: tuple[str, ...] = ()
    earlier: tuple[tuple[Mapping[str, float], ...], ...] = ()

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.mode, self.variant, self.size)

    def unresolved_by_pairs(self, source: str) -> list[str]:
        """The :data:`AGREEMENT_BOUNDS` metrics this row's pairs do not resolve: another run
        may compare the metric (the pairs' median reaches half of :data:`MIN_COUNT` per
        request, or a pair reaches it: two runs are compared where either has it) and the
        pairs' spread (:meth:`spread`) is above the metric's bound, or cannot be told (a
        median of 0)."""
        out = []
        for name, bound in AGREEMENT_BOUNDS.items():
            xs = [metric(p, source, name) for p in self.pairs]
            vals = [x for x in xs if x is not None]
            if len(vals) < 2 or len(vals) < len(xs):
                continue
            if statistics.median(vals) < MIN_COUNT / 2 and max(vals) < MIN_COUNT:
                continue
            sp = self.spread(source, name)
            if sp is None or sp > bound:
                out.append(name)
        return out

    def spread(self, source: str, name: str) -> float | None:
        """How sure ``per_request``'s metric ``name`` is: half the range of the pairs'
        estimates, relative to their median (None: fewer than two pairs, or a median of 0)."""
        xs = [metric(p, source, name) for p in self.pairs]
        vals = [x for x in xs if x is not None]
        if len(vals) < 2 or len(vals) < len(xs):
            return None
        mid = statistics.median(vals)
        return None if mid == 0 else (max(vals) - min(vals)) / 2 / abs(mid)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "variant": self.variant,
            "size": self.size,
            "n1": self.n1,
            "n2": self.n2,
            "warmup_n": self.warmup_n,
            "per_request": dict(self.per_request),
            "fixed": dict(self.fixed),
            "warmup": dict(self.warmup),
            "members": list(self.members),
            "by_part": {p: dict(e) for p, e in self.by_part.items()},
            "background": dict(self.background),
            "pairs": [dict(p) for p in self.pairs],
            "rounds": [list(r) for r in self.rounds],
            "unresolved": list(self.unresolved),
            "earlier": [[dict(p) for p in ps] for ps in self.earlier],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CounterRow:
        return cls(
            mode=str(d["mode"]),
            variant=str(d["variant"]),
            size=int(d["size"]),
            n1=int(d["n1"]),
            n2=int(d["n2"]),
            warmup_n=int(d.get("warmup_n", 0)),
            per_request=_floats(d["per_request"]),
            fixed=_floats(d.get("fixed")),
            warmup=_floats(d.get("warmup")),
            members=tuple(str(m) for m in d.get("members", ())),
            by_part={str(p): _floats(e) for p, e in (d.get("by_part") or {}).items()},
            # format 1: the main thread alone, and one pair (per_request itself)
            background=_floats(d.get("background", d.get("main"))),
            pairs=tuple(_floats(p) for p in d.get("pairs", [d["per_request"]])),
            # format ≤ 2: one round, its own windows; nothing recorded as unresolved
            rounds=tuple((int(a), int(b)) for a, b in d.get("rounds", [[d["n1"], d["n2"]]])),
            unresolved=tuple(str(m) for m in d.get("unresolved", ())),
            earlier=tuple(tuple(_floats(p) for p in ps) for ps in d.get("earlier", ())),
        )


@dataclass(frozen=True)
class KernelRow:
    """The sidecar's kernel work per request at one mode and size, from the base profile's own
    measurements — not re-measured: its probe windows (syscalls, kernel and user CPU of its
    worker threads) and its perf CPU run at the highest rate (``perf_run``; CPU-µs per request,
    kernel symbols vs user space; None without one)."""

    mode: str
    size: int
    requests: int
    syscalls: float
    reads: float
    writes: float
    epoll_waits: float
    kernel_cpu_us: float
    user_cpu_us: float
    perf_kernel_cpu_us: float | None = None
    perf_user_cpu_us: float | None = None
    perf_run: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "size": self.size,
            "requests": self.requests,
            "syscalls": self.syscalls,
            "reads": self.reads,
            "writes": self.writes,
            "epoll_waits": self.epoll_waits,
            "kernel_cpu_us": self.kernel_cpu_us,
            "user_cpu_us": self.user_cpu_us,
            "perf_kernel_cpu_us": self.perf_kernel_cpu_us,
            "perf_user_cpu_us": self.perf_user_cpu_us,
            "perf_run": self.perf_run,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelRow:
        def opt(k: str) -> float | None:
            return None if d.get(k) is None else float(d[k])

        return cls(
            str(d["mode"]),
            int(d["size"]),
            int(d["requests"]),
            float(d["syscalls"]),
            float(d["reads"]),
            float(d["writes"]),
            float(d["epoll_waits"]),
            float(d["kernel_cpu_us"]),
            float(d["user_cpu_us"]),
            opt("perf_kernel_cpu_us"),
            opt("perf_user_cpu_us"),
            str(d.get("perf_run", "")),
        )


@dataclass(frozen=True)
class Microarch:
    """A profile's microarchitectural part: counter rows per mode, variant and size, the
    source and tool that counted them, the simulated cache geometry (valgrind), how functions
    were attributed to parsing/filters/other (``attribution``), the kernel work per request
    from the base profile, and free-form notes."""

    source: str
    tool: str
    rows: tuple[CounterRow, ...]
    geometry: CacheGeometry | None = None
    attribution: str = ""
    kernel: tuple[KernelRow, ...] = ()
    created: str = ""
    notes: tuple[str, ...] = ()

    def row(self, mode: str, variant: str, size: int) -> CounterRow | None:
        return next((r for r in self.rows if r.key == (mode, variant, size)), None)

    def merged(self, newer: Microarch) -> Microarch:
        """``newer``'s rows replace this one's of the same mode, variant and size; the rest
        stay (a later run of some modes or filters extends an earlier one). Sources differ:
        ``newer`` alone."""
        if newer.source != self.source:
            return newer
        keys = {r.key for r in newer.rows}
        kept = tuple(r for r in self.rows if r.key not in keys)
        kk = {(k.mode, k.size) for k in newer.kernel}
        kernel = tuple(k for k in self.kernel if (k.mode, k.size) not in kk) + newer.kernel
        return replace(newer, rows=kept + newer.rows, kernel=kernel)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MICROARCH_FORMAT,
            "source": self.source,
            "tool": self.tool,
            "geometry": None if self.geometry is None else self.geometry.to_dict(),
            "attribution": self.attribution,
            "created": self.created,
            "notes": list(self.notes),
            "rows": [r.to_dict() for r in self.rows],
            "kernel": [k.to_dict() for k in self.kernel],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Microarch:
        fmt = int(d.get("format", MICROARCH_FORMAT))
        if fmt > MICROARCH_FORMAT:
            raise ValueError(
                f"microarch format {fmt} is newer than this meshtax understands ({MICROARCH_FORMAT})"
            )
        return cls(
            source=str(d["source"]),
            tool=str(d.get("tool", "")),
            rows=tuple(CounterRow.from_dict(r) for r in d.get("rows", ())),
            geometry=None if d.get("geometry") is None else CacheGeometry.from_dict(d["geometry"]),
            attribution=str(d.get("attribution", "")),
            kernel=tuple(KernelRow.from_dict(k) for k in d.get("kernel", ())),
            created=str(d.get("created", "")),
            notes=tuple(str(n) for n in d.get("notes", ())),
        )


#: Sahu et al., sidecar proxy characterization (SCoPE): p90 latency, p90 cycles and
#: instructions per request of an HTTP sidecar with a policy, normalized to the same sidecar
#: without it (transcribed from the published figures; never a measurement of this machine)
SAHU = "Sahu et al., sidecar proxy characterization (SCoPE)"
PUBLISHED_RATIOS: dict[str, dict[str, float]] = {
    "ip_tag_1": {"p90_latency": 1.034, "p90_cycles": 1.035, "instructions": 1.052},
    "ip_tag_5": {"p90_latency": 1.039, "p90_cycles": 1.054, "instructions": 1.088},
    "ip_tag_10": {"p90_latency": 1.048, "p90_cycles": 1.108, "instructions": 1.147},
    "rbac_100": {"p90_latency": 1.029, "p90_cycles": 1.123, "instructions": 1.014},
    "rbac_10k": {"p90_latency": 1.044, "p90_cycles": 1.137, "instructions": 1.014},
}
#: the same study: branches per request of the HTTP sidecar (total, mispredicted); its
#: conditional branches are taken + not taken
PUBLISHED_BRANCHES: dict[str, tuple[float, float]] = {
    "conditional": (12.14e3 + 20.64e3, 1.3e3 + 1.0e3),
    "indirect": (3.6e3, 2.0e3),
    "all": (56.5e3, 4.5e3),
}
#: … and its headline microarchitecture numbers (as published: ranges are text)
PUBLISHED_MICROARCH: dict[str, str] = {
    "I-cache MPKI (max)": "75",
    "I-cache MPKI, ordinary microservices": "10-12",
    "branch MPKI (max)": "5",
    "frontend-bound cycles": "9-13 %",
    "IPC, TCP policies": "0.7-0.9",
    "IPC, HTTP policies": "< 0.6",
}
