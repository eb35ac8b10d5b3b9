"""The large-scale study: predicted overhead of every call graph of an ingested trace store
under several sidecar configurations (by default the paper's five), per-graph results in
Parquet, the CDFs of the paper's Figure 12, and a what-if comparison against a second
("after") profile.

Work is split by store partition (one Dask task per partition with ``engine="dask"``); each
partition's call-graph structure is computed once and reused for every configuration and
for the what-if profile. Every service of a graph is given the configuration under study
(a call from outside the graph has no sidecar; callees the store marks unmeshed stay so);
the store's own per-service configurations and platforms are ignored, and ``profile``
prices everything.

Outputs in ``out_dir``::

    graphs/part-00000.parquet   graph, n_calls, base_latency_us, and per configuration C:
                                C.latency_overhead_us, C.latency_overhead_pct, C.cpu_vcpu
                                (+ C.after.* with a what-if profile)
    cdf.csv                     config, metric, quantile, value (1001 quantiles per metric)
    whatif.csv                  per configuration: before/after means and medians
    summary.json                everything in :class:`StudySummary`
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from meshtax.errors import PredictError
from meshtax.model.components import filter_component
from meshtax.model.ecg import PROTOCOLS, EcgBatch, SidecarSpec
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.critical_path import propagate, structure

# the engine's per-sidecar model selection, reused so the study prices exactly like predict_batch
from meshtax.predict.engine import connection_models, spec_models
from meshtax.traces.store import Store, open_store, read_partition

FloatArray = npt.NDArray[np.float64]

#: The five filters of the paper's filter study (Table 3).
PAPER_FILTERS = ("fault_injection", "rate_limit", "tap", "lua", "wasm")
METRICS = ("latency_overhead_us", "latency_overhead_pct", "cpu_vcpu")
N_QUANTILES = 1001


class StudyError(PredictError):
    """A study that cannot run (no input, no runnable configuration, unknown engine)."""


@dataclass(frozen=True)
class StudyConfig:
    """One configuration under study: a name (column prefix) and the sidecar every service gets."""

    name: str
    sidecar: SidecarConfig


def paper_configs() -> tuple[StudyConfig, ...]:
    """TCP, HTTP, gRPC, HTTP with the five filters, gRPC with the five filters."""
    return (
        StudyConfig("tcp", SidecarConfig(Mode.TCP)),
        StudyConfig("http", SidecarConfig(Mode.HTTP)),
        StudyConfig("grpc", SidecarConfig(Mode.GRPC)),
        StudyConfig("http+5filters", SidecarConfig(Mode.HTTP, PAPER_FILTERS)),
        StudyConfig("grpc+5filters", SidecarConfig(Mode.GRPC, PAPER_FILTERS)),
    )


def unsupported(config: StudyConfig, profile: Profile) -> str | None:
    """Why ``profile`` cannot price ``config`` (None: it can)."""
    mp = profile.modes.get(config.sidecar.mode)
    if mp is None:
        return f"profile {profile.name!r} has no {config.sidecar.mode.value} mode"
    missing = [f for f in config.sidecar.filters if filter_component(f) not in mp.components]
    if missing:
        return (
            f"profile {profile.name!r} has no {config.sidecar.mode.value}-mode model for "
            f"filter(s) {', '.join(missing)} (the bundled reference profile has HTTP-mode filters "
            "only); profile the filters or pass a profile that has them"
        )
    return None


def retarget(batch: EcgBatch, sidecar: SidecarConfig) -> EcgBatch:
    """The batch with every meshed sidecar replaced by ``sidecar`` (platform: the study's profile)."""
    return replace(
        batch,
        caller_spec=np.where(batch.caller_spec >= 0, 0, -1),
        callee_spec=np.where(batch.callee_spec >= 0, 0, -1),
        specs=(SidecarSpec(sidecar, None),),
    )


def _row_costs(
    batch: EcgBatch, sidecar: SidecarConfig, profile: Profile
) -> tuple[FloatArray, FloatArray]:
    """Latency (µs) and CPU (CPU-µs per call) added to every row when every meshed sidecar runs
    ``sidecar``: the same models as :func:`~meshtax.predict.engine.hop_costs`, summed over
    components once and evaluated on the distinct (message size, rate) pairs only (traces
    without sizes have one), instead of per component and row."""
    warnings: list[str] = []
    n = batch.n_invocations
    proto = batch.protocol if batch.protocol is not None else np.zeros(n, dtype=np.int64)
    codes = [int(c) for c in np.unique(proto)]
    per_code = {
        c: spec_models(SidecarSpec(sidecar, None), profile, warnings, PROTOCOLS[c]) for c in codes
    }
    sizes = np.concatenate([batch.request_bytes, batch.response_bytes])
    if any(m.rate_coef for ms in per_code.values() for pair in ms.values() for m in pair):
        pairs, inv = np.unique(
            np.column_stack([sizes, np.tile(batch.rate, 2)]), axis=0, return_inverse=True
        )
    else:  # no rate term: the distinct sizes are enough (a 1-D unique is much faster)
        u, inv = np.unique(sizes, return_inverse=True)
        pairs = np.column_stack([u, np.full(u.size, np.nan)])
    inv = inv.reshape(-1)
    q, p = inv[:n], inv[n:]
    lat_row = np.zeros(n)
    cpu_row = np.zeros(n)
    for code, models in per_code.items():
        lat_s = np.zeros(len(pairs))
        cpu_s = np.zeros(len(pairs))
        for lat, cpu in models.values():
            lat_s += lat.predict(pairs[:, 0], pairs[:, 1])
            cpu_s += cpu.predict(pairs[:, 0], pairs[:, 1])
        rows = proto == code
        lat_row[rows] = (lat_s[q] + lat_s[p])[rows]
        cpu_row[rows] = (cpu_s[q] + cpu_s[p])[rows]
    if batch.new_connections is not None:  # per new connection, at each meshed side
        per_conn = connection_models(SidecarSpec(sidecar, None), profile, warnings).values()
        lat_row += batch.new_connections * sum(m.latency.intercept for m in per_conn)
        cpu_row += batch.new_connections * sum(m.cpu.intercept for m in per_conn)
    crossings = (batch.caller_spec >= 0).astype(np.float64) + (batch.callee_spec >= 0)
    return crossings * lat_row, crossings * cpu_row


def predict_partition(
    batch: EcgBatch, configs: Sequence[StudyConfig], profile: Profile, after: Profile | None = None
) -> dict[str, FloatArray]:
    """Per-graph columns of one batch for every configuration (pure; used by every engine)."""
    shape = structure(batch)  # independent of the configuration: computed once
    g = batch.graph_of()
    G = batch.n_graphs
    cols: dict[str, FloatArray] = {}
    base: FloatArray | None = None
    profiles = [("", profile)] + ([(".after", after)] if after is not None else [])
    for cfg in configs:
        b = retarget(batch, cfg.sidecar)
        for suffix, prof in profiles:
            lat, cpu_row = _row_costs(b, cfg.sidecar, prof)
            prop = propagate(shape, lat)
            if base is None:
                base = prop.base_us
            cpu: FloatArray = np.bincount(g, weights=cpu_row * b.rate * 1e-6, minlength=G).astype(
                np.float64
            )
            ov = prop.overhead_us
            with np.errstate(divide="ignore", invalid="ignore"):
                pct = np.where(prop.base_us > 0, 100.0 * ov / prop.base_us, np.nan)
            cols[f"{cfg.name}{suffix}.latency_overhead_us"] = ov
            cols[f"{cfg.name}{suffix}.latency_overhead_pct"] = pct
            cols[f"{cfg.name}{suffix}.cpu_vcpu"] = cpu
    cols = {"base_latency_us": base if base is not None else np.zeros(G), **cols}
    return cols


def _run_partition(
    store_dir: str,
    stem: str,
    specs: tuple[SidecarSpec, ...],
    configs: tuple[StudyConfig, ...],
    profile: Profile,
    after: Profile | None,
    out_dir: str,
) -> dict[str, Any]:
    """One partition: read, predict, write its per-graph Parquet. Runs on any engine's worker."""
    t0 = time.perf_counter()
    batch = read_partition(Path(store_dir), stem, specs, with_names=False)
    cols = predict_partition(batch, configs, profile, after)
    names = pq.read_table(Path(store_dir) / f"{stem}.graphs.parquet", columns=["name"]).column(
        "name"
    )
    table = pa.table(
        {
            "graph": names,
            "n_calls": pa.array(np.diff(batch.graph_ptr).astype(np.int32)),
            **{k: pa.array(v) for k, v in cols.items()},
        }
    )
    out = Path(out_dir) / "graphs" / f"{stem}.parquet"
    pq.write_table(table, out, compression="zstd")
    return {
        "stem": stem,
        "graphs": batch.n_graphs,
        "rows": batch.n_invocations,
        "seconds": time.perf_counter() - t0,
    }


@dataclass(frozen=True)
class StudySummary:
    """What a study ran and found; ``stats[config][metric]`` holds mean and percentiles."""

    out_dir: Path
    engine: str
    graphs: int
    calls: int
    partitions: int
    configs: tuple[str, ...]
    skipped: Mapping[str, str]
    profile: str
    after_profile: str | None
    stats: Mapping[str, Mapping[str, Mapping[str, float]]]
    whatif: Mapping[str, Mapping[str, float]]
    seconds: float
    files: tuple[str, ...] = field(default=())
    profile_quality: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "engine": self.engine,
            "graphs": self.graphs,
            "calls": self.calls,
            "partitions": self.partitions,
            "configs": list(self.configs),
            "skipped": dict(self.skipped),
            "profile": self.profile,
            "after_profile": self.after_profile,
            "stats": {k: {m: dict(s) for m, s in v.items()} for k, v in self.stats.items()},
            "whatif": {k: dict(v) for k, v in self.whatif.items()},
            "seconds": self.seconds,
            "files": list(self.files),
            "profile_quality": dict(self.profile_quality),
        }


Progress = Callable[[int, int], None]


def run_study(
    input: str | os.PathLike[str] | Store,
    configs: Sequence[StudyConfig] | None,
    profile: Profile,
    out_dir: str | os.PathLike[str],
    *,
    engine: Literal["local", "dask"] = "local",
    scheduler: str | Any | None = None,
    speedup_profile: Profile | Callable[[Profile], Profile] | None = None,
    progress: bool | Progress = True,
) -> StudySummary:
    """Run the study over an ingested store (see :mod:`meshtax.traces.store`).

    ``configs``: configurations (None → :func:`paper_configs`); configurations ``profile``
    cannot price (e.g. filters it lacks) are skipped and listed in ``skipped`` with the reason.
    ``engine``: ``local`` (this process) or ``dask`` (``scheduler``: an address such as
    ``tcp://host:8786``, or a ``dask.distributed.Client``/``LocalCluster``; None starts a
    LocalCluster). Workers must see ``input`` and ``out_dir`` at the same paths.
    ``speedup_profile``: the what-if "after" profile, or a function making it from ``profile``.
    ``progress``: a rich progress bar (True), none (False), or a callback (done, total).
    """
    t0 = time.perf_counter()
    store = input if isinstance(input, Store) else open_store(input)
    cfgs = tuple(configs) if configs is not None else paper_configs()
    names = [c.name for c in cfgs]
    if len(set(names)) != len(names):
        raise StudyError(f"configuration names must be unique: {names}")
    after = speedup_profile(profile) if callable(speedup_profile) else speedup_profile
    skipped: dict[str, str] = {}
    runnable = []
    for c in cfgs:
        why = unsupported(c, profile) or (unsupported(c, after) if after is not None else None)
        if why:
            skipped[c.name] = why
        else:
            runnable.append(c)
    if not runnable:
        raise StudyError(
            "no configuration can be priced: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())
        )
    out = Path(out_dir)
    (out / "graphs").mkdir(parents=True, exist_ok=True)
    for old in (out / "graphs").glob("part-*.parquet"):
        old.unlink()
    args = [
        (str(store.dir), p.stem, store.specs, tuple(runnable), profile, after, str(out))
        for p in store.partitions
    ]
    with _progress(progress, len(args), "study") as tick:
        if engine == "local":
            for a in args:
                _run_partition(*a)
                tick()
        elif engine == "dask":
            _run_dask(args, scheduler, tick)
        else:
            raise StudyError(f"engine {engine!r}: expected local or dask")
    stats, whatif, files = _aggregate(out, runnable, after is not None)
    summary = StudySummary(
        out_dir=out,
        engine=engine,
        graphs=store.n_graphs,
        calls=store.n_rows,
        partitions=len(args),
        configs=tuple(c.name for c in runnable),
        skipped=skipped,
        profile=profile.name,
        after_profile=None if after is None else after.name,
        stats=stats,
        whatif=whatif,
        seconds=time.perf_counter() - t0,
        files=files,
        profile_quality=profile.quality(),
    )
    (out / "summary.json").write_text(json.dumps(summary.to_dict(), indent=1))
    return summary


def _run_dask(
    args: Sequence[tuple[Any, ...]], scheduler: str | Any | None, tick: Callable[[], None]
) -> None:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise StudyError(
            "engine 'dask' needs dask.distributed: pip install 'dask[distributed]'"
        ) from None
    own: list[Any] = []
    if scheduler is None:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)  # type: ignore[no-untyped-call]
        own.append(cluster)
        client = Client(cluster)  # type: ignore[no-untyped-call]
        own.insert(0, client)
    elif isinstance(scheduler, Client):
        client = scheduler
    elif isinstance(scheduler, str):
        client = Client(scheduler)  # type: ignore[no-untyped-call]
        own.append(client)
    else:  # a cluster object
        client = Client(scheduler)  # type: ignore[no-untyped-call]
        own.append(client)
    try:
        futures = [client.submit(_run_partition, *a, pure=False) for a in args]
        for f in as_completed(futures):  # type: ignore[no-untyped-call]
            f.result()  # re-raises a worker's error here
            tick()
    finally:
        for o in own:
            o.close()


class _progress:
    def __init__(self, progress: bool | Progress, total: int, label: str) -> None:
        self.p = progress
        self.total = total
        self.label = label
        self.done = 0
        self.bar: Any = None

    def __enter__(self) -> Callable[[], None]:
        if self.p is True:
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(transient=False)
            self.bar.start()
            self.task = self.bar.add_task(f"{self.label}: partitions", total=self.total)
        return self.tick

    def tick(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        elif callable(self.p):
            self.p(self.done, self.total)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _aggregate(
    out: Path, configs: Iterable[StudyConfig], has_after: bool
) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, float]], tuple[str, ...]]:
    """Exact CDFs and statistics from the per-graph files (one column at a time)."""
    parts = sorted((out / "graphs").glob("part-*.parquet"))
    q = np.linspace(0.0, 1.0, N_QUANTILES)
    stats: dict[str, dict[str, dict[str, float]]] = {}
    whatif: dict[str, dict[str, float]] = {}
    cdf_rows: list[tuple[str, str, float, float]] = []
    wrows = []

    def column(name: str) -> FloatArray:
        arrs = [pq.read_table(p, columns=[name]).column(0).to_numpy() for p in parts]
        return np.concatenate(arrs).astype(np.float64) if arrs else np.zeros(0)

    for c in configs:
        stats[c.name] = {}
        for m in METRICS:
            v = column(f"{c.name}.{m}")
            v = v[np.isfinite(v)]
            if v.size == 0:
                continue
            qs = np.quantile(v, q)
            cdf_rows.extend((c.name, m, float(a), float(b)) for a, b in zip(q, qs))
            stats[c.name][m] = {
                "mean": float(v.mean()),
                "p50": float(np.quantile(v, 0.5)),
                "p90": float(np.quantile(v, 0.9)),
                "p99": float(np.quantile(v, 0.99)),
                "max": float(v.max()),
                "n": float(v.size),
            }
        if has_after:
            w: dict[str, float] = {}
            for m in ("latency_overhead_us", "cpu_vcpu"):
                b = column(f"{c.name}.{m}")
                a = column(f"{c.name}.after.{m}")
                ok = np.isfinite(a) & np.isfinite(b)
                a, b = a[ok], b[ok]
                w[f"{m}.before_mean"] = float(b.mean()) if b.size else float("nan")
                w[f"{m}.after_mean"] = float(a.mean()) if a.size else float("nan")
                w[f"{m}.before_p50"] = float(np.median(b)) if b.size else float("nan")
                w[f"{m}.after_p50"] = float(np.median(a)) if a.size else float("nan")
                with np.errstate(divide="ignore", invalid="ignore"):
                    red = np.where(b > 0, 100.0 * (b - a) / b, np.nan)
                red = red[np.isfinite(red)]
                w[f"{m}.reduction_pct_p50"] = float(np.median(red)) if red.size else float("nan")
                w[f"{m}.reduction_pct_mean"] = float(red.mean()) if red.size else float("nan")
            whatif[c.name] = w
            wrows.append((c.name, w))
    files = ["summary.json", "cdf.csv"] + [str(p.relative_to(out)) for p in parts]
    with open(out / "cdf.csv", "w") as f:
        f.write("config,metric,quantile,value\n")
        for r in cdf_rows:
            f.write(f"{r[0]},{r[1]},{r[2]:.6g},{r[3]!r}\n")
    if wrows:
        keys = list(wrows[0][1])
        with open(out / "whatif.csv", "w") as f:
            f.write("config," + ",".join(keys) + "\n")
            for name, w in wrows:
                f.write(name + "," + ",".join(repr(w[k]) for k in keys) + "\n")
        files.append("whatif.csv")
    return stats, whatif, tuple(files)
