"""The prediction result document (format ``meshtax-prediction/1``): self-describing data.

It carries the tool version, the profile (name, platform, provenance) and whether that
platform is this host, the options, warnings, every graph's numbers with their intervals,
the distribution over graphs, and an optional what-if comparison. Exporters and plots read
this document, never internal objects.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, overload

import numpy as np

from meshtax._version import __version__
from meshtax.model.components import Component
from meshtax.model.ecg import EcgBatch
from meshtax.model.profile import Platform, Profile
from meshtax.predict.engine import BatchPrediction

FORMAT = "meshtax-prediction/1"
PERCENTILES = (50, 90, 99)
MAX_DETAILED_GRAPHS = 200  # beyond this, per-graph detail (paths, services, rows) is left out


def _est(v: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": float(v), "lo": float(lo), "hi": float(hi)}


def _dist(x: np.ndarray[Any, Any]) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    return {"mean": float(x.mean()), **{f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}}


def _label(batch: EcgBatch, r: int) -> str:
    caller = "client" if batch.caller[r] < 0 else batch.services[batch.caller[r]]
    callee = batch.services[batch.callee[r]]
    return f"{caller}→{callee}"


#: per-graph numbers of a :class:`BatchPrediction`, one value per graph
_PER_GRAPH = (
    "base_latency_us",
    "latency_overhead_us",
    "latency_lo_us",
    "latency_hi_us",
    "cpu_vcpu",
    "cpu_lo_vcpu",
    "cpu_hi_vcpu",
    "absorbed_us",
)
_BY_COMPONENT = ("latency_by_component", "cpu_by_component")  # graphs × components


def _numbers(
    name: str, comps: Sequence[str], c: Mapping[str, Any], pct: np.ndarray[Any, Any], g: int
) -> dict[str, Any]:
    """One graph's numbers (``c``: the per-graph columns, by :class:`BatchPrediction` name)."""
    return {
        "name": name,
        "base_latency_us": float(c["base_latency_us"][g]),
        "latency_overhead_us": _est(
            c["latency_overhead_us"][g], c["latency_lo_us"][g], c["latency_hi_us"][g]
        ),
        "latency_overhead_pct": float(pct[g]),
        "cpu_vcpu": _est(c["cpu_vcpu"][g], c["cpu_lo_vcpu"][g], c["cpu_hi_vcpu"][g]),
        "latency_by_component_us": dict(zip(comps, map(float, c["latency_by_component"][g]))),
        "absorbed_us": float(c["absorbed_us"][g]),
        "cpu_by_component_vcpu": dict(zip(comps, map(float, c["cpu_by_component"][g]))),
    }


_ALL = (*_PER_GRAPH, *_BY_COMPONENT)


def _columns(bp: BatchPrediction) -> dict[str, np.ndarray[Any, Any]]:
    return {k: getattr(bp, k) for k in _ALL}


def _graph(
    batch: EcgBatch, bp: BatchPrediction, g: int, detailed: bool, pct: np.ndarray[Any, Any]
) -> dict[str, Any]:
    comps = [c.key for c in bp.components]
    out = _numbers(batch.graph_names[g], comps, _columns(bp), pct, g)
    if not detailed:
        return out
    lo, hi = int(batch.graph_ptr[g]), int(batch.graph_ptr[g + 1])
    rows = range(lo, hi)
    svc_lat: dict[str, float] = {}
    svc_cpu: dict[str, float] = {}
    bound = bp.cpu_bound is not None and bool(bp.cpu_bound[g])
    for r in rows:
        for side, lat, cpu in (
            (batch.caller[r], bp.row_latency_caller_us[r], bp.row_cpu_caller_vcpu[r]),
            (batch.callee[r], bp.row_latency_callee_us[r], bp.row_cpu_callee_vcpu[r]),
        ):
            if side < 0:
                continue
            name = batch.services[side]
            if bound:  # the request's CPU work queued on the shared CPUs sets the latency
                on_path = (
                    float(cpu) / float(batch.rate[r]) * 1e6 / (bp.pod_cpus or 1)
                    if batch.rate[r] > 0
                    else 0.0
                )
            else:
                on_path = float(lat) if bp.critical[r] else 0.0
            if name not in svc_cpu and bp.service_idle_vcpu is not None:
                idle = float(bp.service_idle_vcpu[side])  # its idle sidecar, once per graph
                cpu += idle
                root_rate = float(batch.rate[lo])
                if bound and root_rate > 0:  # its share per request joins the CPU work
                    on_path += idle * 1e6 / root_rate / (bp.pod_cpus or 1)
            svc_lat[name] = svc_lat.get(name, 0.0) + on_path
            svc_cpu[name] = svc_cpu.get(name, 0.0) + float(cpu)
    out["by_service"] = [
        {"service": s, "latency_on_path_us": svc_lat.get(s, 0.0), "cpu_vcpu": svc_cpu[s]}
        for s in sorted(svc_cpu, key=lambda k: -svc_cpu[k])
    ]
    ids = batch.row_ids
    out["critical_path"] = [_label(batch, r) for r in rows if bp.critical[r]]
    out["critical_path_before"] = [_label(batch, r) for r in rows if bp.critical_before[r]]
    out["critical_path_changed"] = out["critical_path"] != out["critical_path_before"]
    out["invocations"] = [
        {
            "id": ids[r] if ids else str(r - lo),
            "hop": _label(batch, r),
            "parent": None
            if batch.parent[r] < 0
            else (ids[batch.parent[r]] if ids else str(batch.parent[r] - lo)),
            "start_us": float(batch.start_us[r]),
            "duration_us": float(batch.duration_us[r]),
            "request_bytes": float(batch.request_bytes[r]),
            "response_bytes": float(batch.response_bytes[r]),
            "rate_rps": float(batch.rate[r]),
            "latency_added_us": float(bp.row_latency_caller_us[r] + bp.row_latency_callee_us[r]),
            "cpu_vcpu": float(bp.row_cpu_caller_vcpu[r] + bp.row_cpu_callee_vcpu[r]),
            "critical": bool(bp.critical[r]),
        }
        for r in rows
    ]
    return out


def profile_block(profile: Profile, host: Platform | None) -> dict[str, Any]:
    return {
        "name": profile.name,
        "source": profile.provenance.source,
        "by": profile.provenance.by,
        "created": profile.provenance.created,
        "platform": profile.platform.to_dict(),
        "platform_is_this_host": bool(host is not None and profile.platform.same_host(host)),
        "notes": list(profile.provenance.notes),
        "quality": profile.quality(),
    }


def _pct(base: np.ndarray[Any, Any], overhead: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Latency overhead in % of the mesh-free latency (as ``BatchPrediction``'s)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(base > 0, 100.0 * overhead / base, np.nan)


#: beyond this many graphs, a prediction's per-graph columns are kept in a temporary file
SPILL_GRAPHS = 4096


@dataclass
class _Block:
    """The columns of one batch's graphs: in memory, or in the spill file at ``at``."""

    n: int
    comps: tuple[Component, ...]
    names: tuple[str, ...] | None = None
    cols: dict[str, np.ndarray[Any, Any]] | None = None
    at: dict[str, int] | None = None  # where each column (and "names") starts in the file


class GraphColumns:
    """Every graph's numbers of a prediction made batch by batch, as NumPy columns (about
    20 numbers and a name a graph, instead of a dict of ~4 kB): added per batch, joined
    when read. Components missing from a batch count 0 in its graphs. Beyond
    ``spill_after`` graphs the batches' columns go to a temporary file, so memory stays
    flat in the number of graphs: a graph is read back with its batch, the summary from
    all of them."""

    def __init__(self, spill_after: int | None = None) -> None:
        self._blocks: list[_Block] = []
        self._n = 0
        self._spill_after = SPILL_GRAPHS if spill_after is None else spill_after
        self._file: IO[bytes] | None = None
        self._read: tuple[int, _Block] | None = None  # the spilled block read last
        self._joined: tuple[int, tuple[str, ...], dict[str, Any], Any] | None = None  # ... joined
        self._pct: np.ndarray[Any, Any] | None = None

    def add(self, names: Sequence[str], bp: BatchPrediction) -> None:
        # copies: a view would keep the batch's row-level arrays alive
        cols = {k: np.array(v) for k, v in _columns(bp).items()}
        self._blocks.append(_Block(len(names), bp.components, tuple(names), cols))
        self._n += len(names)
        self._pct, self._joined = None, None  # a new component joins every block anew
        if self._n > self._spill_after:
            self._spill()

    def __len__(self) -> int:
        return self._n

    @property
    def components(self) -> tuple[Component, ...]:
        return tuple(sorted({c for b in self._blocks for c in b.comps}))

    def _spill(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="meshtax-graphs-")
            weakref.finalize(self, self._file.close)  # closed (and gone) with the columns
        f = self._file
        f.seek(0, os.SEEK_END)
        for b in self._blocks:
            if b.cols is None:
                continue
            b.at = {}
            for k in _ALL:
                b.at[k] = f.tell()
                np.lib.format.write_array(f, b.cols[k], allow_pickle=False)
            b.at["names"] = f.tell()
            f.write(json.dumps(b.names).encode() + b"\n")  # ASCII: any name survives
            b.cols, b.names = None, None

    def _load(self, i: int, keys: Sequence[str] = _ALL, names: bool = True) -> _Block:
        """Block ``i`` with its columns ``keys`` (and names), read back when spilled."""
        b = self._blocks[i]
        if b.cols is not None:
            return b
        if self._read is not None and self._read[0] == i:
            return self._read[1]
        assert self._file is not None and b.at is not None
        f = self._file
        cols = {}
        for k in keys:
            f.seek(b.at[k])
            cols[k] = np.lib.format.read_array(f, allow_pickle=False)
        if names:
            f.seek(b.at["names"])
        loaded = _Block(b.n, b.comps, tuple(json.loads(f.readline())) if names else None, cols)
        if names and len(keys) == len(_ALL):
            self._read = (i, loaded)
        return loaded

    def joined(self, keys: Sequence[str] = _ALL) -> dict[str, np.ndarray[Any, Any]]:
        """The columns ``keys`` of every graph (in memory: joined once, later batches join
        again; spilled: read back batch by batch for the caller, not kept)."""
        if not self._blocks:
            return {k: np.zeros((0, 0) if k in _BY_COMPONENT else 0) for k in _ALL}
        if self._file is not None:
            load = (self._load(i, keys, names=False) for i in range(len(self._blocks)))
            return _join(load, self.components, self._n, keys)
        if len(self._blocks) != 1 or self._blocks[0].comps != self.components:
            comps = self.components
            joined = _join(self._blocks, comps, self._n)
            names = tuple(n for b in self._blocks for n in b.names or ())
            self._blocks = [_Block(self._n, comps, names, joined)]
        cols = self._blocks[0].cols
        assert cols is not None
        return cols

    def pct(self) -> np.ndarray[Any, Any]:
        if self._pct is not None:
            return self._pct
        c = self.joined(("base_latency_us", "latency_overhead_us"))
        pct = _pct(c["base_latency_us"], c["latency_overhead_us"])
        if self._file is None:
            self._pct = pct
        return pct

    def graph(self, g: int) -> dict[str, Any]:
        """Graph ``g``'s numbers, as the document's per-graph entry without detail."""
        keys = [k.key for k in self.components]
        if self._file is None:
            c = self.joined()
            names = self._blocks[0].names
            assert names is not None
            return _numbers(names[g], keys, c, self.pct(), g)
        ends = np.cumsum([b.n for b in self._blocks])
        i = int(np.searchsorted(ends, g, side="right"))
        names, c, pct = self._joined_block(i)
        at = g - (int(ends[i - 1]) if i else 0)
        return _numbers(names[at], keys, c, pct, at)

    def graphs(self) -> Iterator[dict[str, Any]]:
        """Every graph's entry (as :meth:`graph`) in order, a block read and joined once."""
        keys = [k.key for k in self.components]
        if self._file is None:
            for g in range(self._n):
                yield self.graph(g)
            return
        for i in range(len(self._blocks)):
            names, c, pct = self._joined_block(i)
            for at in range(len(names)):
                yield _numbers(names[at], keys, c, pct, at)

    def _joined_block(
        self, i: int
    ) -> tuple[tuple[str, ...], dict[str, np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
        """Spilled block ``i``: its names, its columns over every component, their %."""
        if self._joined is None or self._joined[0] != i:
            b = self._load(i)
            assert b.names is not None
            c = _join([b], self.components, b.n)
            pct = _pct(c["base_latency_us"], c["latency_overhead_us"])
            self._joined = (i, b.names, c, pct)
        return self._joined[1:]

    def summary(self) -> dict[str, Any]:
        """Totals and distributions over all graphs."""
        c = self.joined(_SUMMARY)
        comps = [k.key for k in self.components]
        return {
            "graphs": len(self),
            "latency_overhead_us": _dist(c["latency_overhead_us"]),
            "latency_overhead_pct": _dist(_pct(c["base_latency_us"], c["latency_overhead_us"])),
            "cpu_vcpu": _dist(c["cpu_vcpu"]),
            "cpu_vcpu_total": float(c["cpu_vcpu"].sum()),
            "latency_by_component_us_mean": dict(
                zip(comps, map(float, c["latency_by_component"].mean(axis=0)))
            ),
            "cpu_by_component_vcpu_mean": dict(
                zip(comps, map(float, c["cpu_by_component"].mean(axis=0)))
            ),
        }


#: the columns a summary reads
_SUMMARY = (
    "base_latency_us",
    "latency_overhead_us",
    "cpu_vcpu",
    "latency_by_component",
    "cpu_by_component",
)


def _join(
    blocks: Iterable[_Block],
    comps: tuple[Component, ...],
    n: int,
    keys: Sequence[str] = _ALL,
) -> dict[str, np.ndarray[Any, Any]]:
    """The columns ``keys`` of ``blocks`` (``n`` graphs) one after another, by-component
    ones over ``comps``, filled block by block."""
    ix = {c: k for k, c in enumerate(comps)}
    out: dict[str, np.ndarray[Any, Any]] = {}
    at = 0
    for b in blocks:
        assert b.cols is not None
        for k in keys:
            v = b.cols[k]
            if k not in out:
                shape = (n, len(comps)) if k in _BY_COMPONENT else (n,)
                out[k] = np.zeros(shape, dtype=v.dtype)
            if k in _BY_COMPONENT:
                out[k][at : at + b.n, [ix[c] for c in b.comps]] = v
            else:
                out[k][at : at + b.n] = v
        at += b.n
    return out


class GraphList(Sequence[dict[str, Any]]):
    """The document's ``graphs`` beyond ``MAX_DETAILED_GRAPHS`` graphs: each graph's entry
    rendered from :class:`GraphColumns` when read, so the document holds columns, not a dict
    per graph. Exporters read it as a list."""

    def __init__(self, columns: GraphColumns) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self.columns.graph(i % n)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.columns.graphs()


def summary(bp: BatchPrediction) -> dict[str, Any]:
    """Totals and distributions over all graphs of a prediction."""
    cols = GraphColumns()
    cols.add(("",) * bp.base_latency_us.size, bp)
    return cols.summary()


#: a warning a batch says with its own largest message: said once, with the largest
_LARGEST = re.compile(r"^messages up to (\d+) B (.*)$", re.S)


def _merge_warnings(warnings: Sequence[str]) -> list[str]:
    out: dict[str, str] = {}
    for w in warnings:
        m = _LARGEST.match(w)
        key = f"\0{m.group(2)}" if m else w
        if m and key in out:
            have = _LARGEST.match(out[key])
            assert have is not None
            if int(m.group(1)) <= int(have.group(1)):
                continue
        out[key] = w if m else out.get(key, w)
    return list(out.values())


class PredictionBuilder:
    """The result document of a prediction made batch by batch: :meth:`add` each batch's
    prediction (and the what-if's), then :meth:`document`. Holds every graph's numbers as
    columns, and the detail (services, paths, invocations) of every graph while there are
    at most ``MAX_DETAILED_GRAPHS``; beyond, the document's ``graphs`` is a
    :class:`GraphList` without detail."""

    def __init__(self) -> None:
        self.columns = GraphColumns()
        self.after: GraphColumns | None = None
        self.first: list[dict[str, Any]] = []
        self.first_after: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.pod_cpus: int | None = None
        self.bound: int | None = None

    def add(self, batch: EcgBatch, bp: BatchPrediction, after: BatchPrediction | None) -> None:
        done = len(self.columns)
        if done < MAX_DETAILED_GRAPHS:
            pct = bp.latency_overhead_pct  # a property computed per access: once a batch
            for g in range(min(batch.n_graphs, MAX_DETAILED_GRAPHS - done)):
                self.first.append(_graph(batch, bp, g, True, pct))
                if after is not None:
                    self.first_after.append(
                        {
                            "name": batch.graph_names[g],
                            "latency_overhead_us": float(after.latency_overhead_us[g]),
                            "cpu_vcpu": float(after.cpu_vcpu[g]),
                        }
                    )
        self.columns.add(batch.graph_names, bp)
        if len(self.columns) > MAX_DETAILED_GRAPHS:  # detail only when every graph has it
            self.first, self.first_after = [], []
        if after is not None:
            self.after = self.after or GraphColumns()
            self.after.add(batch.graph_names, after)
        self.warnings = _merge_warnings([*self.warnings, *bp.warnings])
        if bp.pod_cpus is not None and bp.cpu_bound is not None:
            self.pod_cpus = bp.pod_cpus
            self.bound = (self.bound or 0) + int(bp.cpu_bound.sum())

    def document(
        self,
        profile: Profile,
        *,
        host: Platform | None,
        options: Mapping[str, Any],
        warnings: Sequence[str] = (),
        whatif: tuple[str, Profile] | None = None,
        created: str | None = None,
    ) -> dict[str, Any]:
        """``whatif``: (speedup description, profile after), when every batch had an after."""
        n = len(self.columns)
        detailed = n <= MAX_DETAILED_GRAPHS
        graphs = self.first if detailed else GraphList(self.columns)
        doc: dict[str, Any] = {
            "format": FORMAT,
            "tool": {"name": "meshtax", "version": __version__},
            "created": created or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "profile": profile_block(profile, host),
            "options": dict(options),
            "warnings": list(dict.fromkeys([*warnings, *self.warnings])),
            "components": [c.key for c in self.columns.components],
            "graphs": graphs,
            "summary": self.columns.summary(),
        }
        if self.pod_cpus is not None and self.bound is not None:
            doc["placement"] = {
                "pod_cpus": self.pod_cpus,
                "graphs_bound_by_cpu": self.bound,
                "rule": "latency overhead = max(critical path, the request's sidecar CPU work "
                "÷ pod_cpus)",
            }
        if not detailed:
            doc["warnings"].append(
                f"{n} graphs: per-graph paths, services and invocations are left out "
                f"beyond {MAX_DETAILED_GRAPHS}"
            )
        if whatif is not None and self.after is not None:
            desc, prof_after = whatif
            before_s, after_s = self.columns.summary(), self.after.summary()
            doc["whatif"] = {
                "speedup": desc,
                "profile_after": prof_after.name,
                "before": before_s,
                "after": after_s,
                "saving": {
                    "latency_overhead_us_mean": before_s["latency_overhead_us"]["mean"]
                    - after_s["latency_overhead_us"]["mean"],
                    "latency_overhead_pct_points_mean": before_s["latency_overhead_pct"]["mean"]
                    - after_s["latency_overhead_pct"]["mean"],
                    "cpu_vcpu_total": before_s["cpu_vcpu_total"] - after_s["cpu_vcpu_total"],
                    "cpu_saving_fraction": (
                        (before_s["cpu_vcpu_total"] - after_s["cpu_vcpu_total"])
                        / before_s["cpu_vcpu_total"]
                        if before_s["cpu_vcpu_total"]
                        else 0.0
                    ),
                },
                "per_graph_after": self.first_after if detailed else [],
            }
        return doc


def prediction_document(
    batch: EcgBatch,
    bp: BatchPrediction,
    profile: Profile,
    *,
    host: Platform | None,
    options: Mapping[str, Any],
    warnings: Sequence[str] = (),
    whatif: tuple[str, BatchPrediction, Profile] | None = None,
    created: str | None = None,
) -> dict[str, Any]:
    """Build the result document of one batch. ``whatif``: (speedup description, prediction
    after, profile after)."""
    b = PredictionBuilder()
    b.add(batch, bp, whatif[1] if whatif else None)
    return b.document(
        profile,
        host=host,
        options=options,
        warnings=warnings,
        whatif=(whatif[0], whatif[2]) if whatif else None,
        created=created,
    )
