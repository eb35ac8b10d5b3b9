"""Ingested call graphs as partitioned Parquet: the columnar :class:`EcgBatch` rows plus a
graph index per partition, and one manifest.

Layout of a store directory::

    manifest.json                 format, specs, partitions (graphs, rows), import report
    part-00000.rows.parquet       one row per invocation (parent is a row of the partition)
    part-00000.graphs.parquet     name, row_start, n_rows of every graph of the partition
    part-00000.services.parquet   service names (caller/callee index into them)

A partition is the unit of work of the study (and of a Dask task): memory is bounded by
the partition size, never by the input size.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from meshtax import safeio
from meshtax.errors import InputError, TraceError
from meshtax.model.ecg import EcgBatch, SidecarSpec
from meshtax.model.schema import problems
from meshtax.model.sidecar import SidecarConfig

#: Version of the store layout. 1 — 2026-11-22: first layout.
STORE_FORMAT = 1
MANIFEST = "manifest.json"

_ROW_COLS = (
    "graph",
    "parent",
    "caller",
    "callee",
    "caller_spec",
    "callee_spec",
    "request_bytes",
    "response_bytes",
    "rate",
    "start_us",
    "duration_us",
)


class TraceStoreError(TraceError):
    """A store directory that is missing, incomplete, damaged or of an unknown format."""


StoreError = TraceStoreError  # its name before the error types had layers


def slice_graphs(batch: EcgBatch, g0: int, g1: int) -> EcgBatch:
    """Graphs ``g0:g1`` of a batch as a batch of their own (rows and parents rebased)."""
    r0, r1 = int(batch.graph_ptr[g0]), int(batch.graph_ptr[g1])
    parent = batch.parent[r0:r1]
    return replace(
        batch,
        graph_ptr=batch.graph_ptr[g0 : g1 + 1] - r0,
        parent=np.where(parent >= 0, parent - r0, -1),
        caller=batch.caller[r0:r1],
        callee=batch.callee[r0:r1],
        caller_spec=batch.caller_spec[r0:r1],
        callee_spec=batch.callee_spec[r0:r1],
        request_bytes=batch.request_bytes[r0:r1],
        response_bytes=batch.response_bytes[r0:r1],
        rate=batch.rate[r0:r1],
        start_us=batch.start_us[r0:r1],
        duration_us=batch.duration_us[r0:r1],
        graph_names=batch.graph_names[g0:g1],
    )


def concat_batches(batches: Sequence[EcgBatch]) -> EcgBatch:
    """One batch of all graphs of ``batches`` (services and specs merged by value)."""
    services: dict[str, int] = {}
    specs: dict[SidecarSpec, int] = {}
    cols: dict[str, list[np.ndarray[Any, Any]]] = {k: [] for k in _ROW_COLS if k != "graph"}
    ptr = [np.zeros(1, dtype=np.int64)]
    names: list[str] = []
    base = 0
    for b in batches:
        smap = np.array(
            [services.setdefault(s, len(services)) for s in b.services] + [-1], dtype=np.int64
        )
        pmap = np.array([specs.setdefault(s, len(specs)) for s in b.specs] + [-1], dtype=np.int64)
        cols["parent"].append(np.where(b.parent >= 0, b.parent + base, -1))
        cols["caller"].append(smap[b.caller])
        cols["callee"].append(smap[b.callee])
        cols["caller_spec"].append(pmap[b.caller_spec])
        cols["callee_spec"].append(pmap[b.callee_spec])
        for k in ("request_bytes", "response_bytes", "rate", "start_us", "duration_us"):
            cols[k].append(getattr(b, k))
        ptr.append(b.graph_ptr[1:] + base)
        names.extend(b.graph_names)
        base += b.n_invocations
    cat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}

    def i64(k: str) -> npt.NDArray[np.int64]:
        return cat[k].astype(np.int64)

    def f64(k: str) -> npt.NDArray[np.float64]:
        return cat[k].astype(np.float64)

    return EcgBatch(
        graph_ptr=np.concatenate(ptr).astype(np.int64),
        parent=i64("parent"),
        caller=i64("caller"),
        callee=i64("callee"),
        caller_spec=i64("caller_spec"),
        callee_spec=i64("callee_spec"),
        request_bytes=f64("request_bytes"),
        response_bytes=f64("response_bytes"),
        rate=f64("rate"),
        start_us=f64("start_us"),
        duration_us=f64("duration_us"),
        services=tuple(services),
        specs=tuple(specs),
        graph_names=tuple(names),
    )


def _spec_to_dict(s: SidecarSpec) -> dict[str, Any]:
    return {"config": s.config.to_dict(), "platform": s.platform}


def _spec_from_dict(d: Mapping[str, Any]) -> SidecarSpec:
    return SidecarSpec(SidecarConfig.from_dict(dict(d["config"])), d.get("platform"))


@dataclass(frozen=True)
class PartitionInfo:
    """One partition: its file stem, graph and row counts."""

    stem: str
    graphs: int
    rows: int


class StoreWriter:
    """Writes batches as partitions; :meth:`close` writes the manifest (a store without a
    manifest is incomplete and refused by :func:`open_store`)."""

    def __init__(
        self, directory: str | os.PathLike[str], *, source: str = "", overwrite: bool = False
    ) -> None:
        self.dir = Path(directory)
        if (self.dir / MANIFEST).exists() and not overwrite:
            raise StoreError(
                f"{self.dir}: already holds a store; choose another directory or pass overwrite"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        if overwrite:
            for f in self.dir.glob("part-*.parquet"):
                f.unlink()
            (self.dir / MANIFEST).unlink(missing_ok=True)
        self.source = source
        self._specs: dict[SidecarSpec, int] = {}
        self.partitions: list[PartitionInfo] = []

    def append(self, batch: EcgBatch) -> PartitionInfo | None:
        """Write ``batch`` as the next partition (empty batches are skipped)."""
        if batch.n_graphs == 0:
            return None
        stem = f"part-{len(self.partitions):05d}"
        pmap = np.array(
            [self._specs.setdefault(s, len(self._specs)) for s in batch.specs] + [-1],
            dtype=np.int64,
        )
        rows = pa.table(
            {
                "graph": pa.array(batch.graph_of().astype(np.int32)),
                "parent": pa.array(batch.parent),
                "caller": pa.array(batch.caller.astype(np.int32)),
                "callee": pa.array(batch.callee.astype(np.int32)),
                "caller_spec": pa.array(pmap[batch.caller_spec].astype(np.int16)),
                "callee_spec": pa.array(pmap[batch.callee_spec].astype(np.int16)),
                "request_bytes": pa.array(batch.request_bytes),
                "response_bytes": pa.array(batch.response_bytes),
                "rate": pa.array(batch.rate),
                "start_us": pa.array(batch.start_us),
                "duration_us": pa.array(batch.duration_us),
            }
        )
        graphs = pa.table(
            {
                "name": pa.array(batch.graph_names, type=pa.string()),
                "row_start": pa.array(batch.graph_ptr[:-1]),
                "n_rows": pa.array(np.diff(batch.graph_ptr)),
            }
        )
        pq.write_table(rows, self.dir / f"{stem}.rows.parquet", compression="zstd")
        pq.write_table(graphs, self.dir / f"{stem}.graphs.parquet", compression="zstd")
        pq.write_table(
            pa.table({"name": pa.array(batch.services, type=pa.string())}),
            self.dir / f"{stem}.services.parquet",
        )
        info = PartitionInfo(stem, batch.n_graphs, batch.n_invocations)
        self.partitions.append(info)
        return info

    def close(self, report: Mapping[str, Any] | None = None) -> Store:
        manifest = {
            "format": STORE_FORMAT,
            "kind": "meshtax-ecg-store",
            "source": self.source,
            "specs": [_spec_to_dict(s) for s in self._specs],
            "partitions": [
                {"stem": p.stem, "graphs": p.graphs, "rows": p.rows} for p in self.partitions
            ],
            "report": dict(report or {}),
        }
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, default=str))
        tmp.replace(self.dir / MANIFEST)  # atomic: a store is complete or has no manifest
        return open_store(self.dir)


@dataclass(frozen=True)
class Store:
    """An opened store: the manifest, and partitions read on demand."""

    dir: Path
    specs: tuple[SidecarSpec, ...]
    partitions: tuple[PartitionInfo, ...]
    source: str
    report: Mapping[str, Any]

    @property
    def n_graphs(self) -> int:
        return sum(p.graphs for p in self.partitions)

    @property
    def n_rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    def read(self, i: int) -> EcgBatch:
        """Partition ``i`` as a batch."""
        return read_partition(self.dir, self.partitions[i].stem, self.specs)

    def __iter__(self) -> Iterator[EcgBatch]:
        for i in range(len(self.partitions)):
            yield self.read(i)


def _table(path: Path, columns: list[str] | None = None) -> pa.Table:
    try:
        safeio.check_regular(path, "a store partition file")
        return pq.read_table(path, columns=columns)
    except InputError as e:
        raise TraceStoreError(str(e), file=str(path)) from None
    except (pa.ArrowException, OSError, ValueError) as e:
        raise TraceStoreError(
            f"{path}: not a readable partition ({str(e).splitlines()[0][:160]}); "
            "the store is damaged: ingest it again",
            file=str(path),
        ) from None


def read_partition(
    directory: Path, stem: str, specs: tuple[SidecarSpec, ...], *, with_names: bool = True
) -> EcgBatch:
    """One partition as a batch, checked (columns, index ranges, finite non-negative sizes,
    rates and durations); ``with_names=False`` leaves ``graph_names`` empty (faster when the
    caller reads the names column itself)."""
    rows = _table(directory / f"{stem}.rows.parquet")
    graphs = _table(
        directory / f"{stem}.graphs.parquet",
        columns=["name", "n_rows"] if with_names else ["n_rows"],
    )
    services = _table(directory / f"{stem}.services.parquet")
    where = str(directory / stem)

    def col(name: str, dtype: type) -> np.ndarray[Any, Any]:
        try:
            c = rows.column(name)
            out: np.ndarray[Any, Any] = np.asarray(c.to_numpy(zero_copy_only=False), dtype=dtype)
        except (KeyError, pa.ArrowException, TypeError, ValueError):
            raise TraceStoreError(
                f"{where}.rows.parquet: column {name!r} missing or not numeric; the store is "
                "damaged: ingest it again",
                file=where,
            ) from None
        return out

    try:
        n_rows = np.asarray(graphs.column("n_rows").to_numpy(zero_copy_only=False), np.int64)
        names = graphs.column("name").to_pylist() if with_names else []
        service_names = services.column("name").to_pylist()
    except (KeyError, pa.ArrowException, TypeError, ValueError):
        raise TraceStoreError(
            f"{where}: graph or service index damaged; ingest the store again", file=where
        ) from None
    ptr = np.zeros(n_rows.size + 1, dtype=np.int64)
    np.cumsum(n_rows, out=ptr[1:])
    batch = EcgBatch(
        graph_ptr=ptr,
        parent=col("parent", np.int64),
        caller=col("caller", np.int64),
        callee=col("callee", np.int64),
        caller_spec=col("caller_spec", np.int64),
        callee_spec=col("callee_spec", np.int64),
        request_bytes=col("request_bytes", np.float64),
        response_bytes=col("response_bytes", np.float64),
        rate=col("rate", np.float64),
        start_us=col("start_us", np.float64),
        duration_us=col("duration_us", np.float64),
        services=tuple(str(s) for s in service_names),
        specs=specs,
        graph_names=tuple(str(g) for g in names),
    )
    bad = batch_problems(batch)
    if bad:
        raise TraceStoreError(f"{where}: {bad}; the store is damaged: ingest it again", file=where)
    return batch


def batch_problems(b: EcgBatch) -> str:
    """What makes a columnar batch unusable (empty string: nothing): lengths, the row index
    of graphs and parents, service and sidecar indices, non-finite or negative values."""
    n = b.n_invocations
    cols: list[np.ndarray[Any, Any]] = [b.caller, b.callee, b.caller_spec, b.callee_spec]
    cols += [b.request_bytes, b.response_bytes, b.rate, b.start_us, b.duration_us]
    if any(c.shape != (n,) for c in cols):
        return "columns of different lengths"
    if (np.diff(b.graph_ptr) < 0).any() or b.graph_ptr[0] != 0 or b.graph_ptr[-1] != n:
        return f"graph row counts do not add up to the {n} rows"
    rows = np.arange(n)
    g0 = np.repeat(b.graph_ptr[:-1], np.diff(b.graph_ptr))
    if ((b.parent >= rows) | ((b.parent >= 0) & (b.parent < g0)) | (b.parent < -1)).any():
        return "a parent that does not precede its child in the same graph"
    ns, nspec = len(b.services), len(b.specs)
    for name, c, hi in (
        ("caller", b.caller, ns),
        ("callee", b.callee, ns),
        ("caller_spec", b.caller_spec, nspec),
        ("callee_spec", b.callee_spec, nspec),
    ):
        if ((c < -1) | (c >= hi)).any():
            return f"{name} index out of range"
    for name, f in (
        ("request_bytes", b.request_bytes),
        ("response_bytes", b.response_bytes),
        ("rate", b.rate),
        ("duration_us", b.duration_us),
    ):
        if not np.isfinite(f).all() or (f < 0).any():
            return f"{name}: not finite or negative"
    if not np.isfinite(b.start_us).all():
        return "start_us: not finite"
    return ""


_STEM = re.compile(r"^part-[0-9]{5,}$")
_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}
#: JSON Schema of the manifest (unknown fields allowed; numbers finite: model/schema.py)
MANIFEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["kind", "format", "specs", "partitions"],
    "properties": {
        "kind": {"const": "meshtax-ecg-store"},
        "format": {"type": "integer", "minimum": 1},
        "source": {"type": "string"},
        "specs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["config"],
                "properties": {
                    "config": {"type": "object"},
                    "platform": {"anyOf": [{"type": "null"}, {"type": "string"}]},
                },
            },
        },
        "partitions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["stem", "graphs", "rows"],
                "properties": {
                    "stem": {"type": "string", "pattern": _STEM.pattern},
                    "graphs": _COUNT,
                    "rows": _COUNT,
                },
            },
        },
        "report": {"type": "object"},
    },
}


def open_store(directory: str | os.PathLike[str]) -> Store:
    d = Path(directory)
    m = d / MANIFEST
    if not m.exists():
        raise StoreError(
            f"{d}: no {MANIFEST}; not an ingested trace store (or its ingestion did not finish)"
        )
    try:
        doc = safeio.parse_json(safeio.read_text(m, "a store manifest"), str(m))
    except InputError as e:
        raise StoreError(str(e), file=str(m)) from None
    if isinstance(doc, dict) and doc.get("kind") != "meshtax-ecg-store":
        raise StoreError(f"{m}: not a meshtax trace store manifest", file=str(m))
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if isinstance(fmt, int) and fmt > STORE_FORMAT:
        raise StoreError(
            f"{m}: store format {fmt} is newer than this meshtax understands ({STORE_FORMAT})"
        )
    bad = problems(MANIFEST_SCHEMA, doc, limit=5)
    if bad:
        raise StoreError(f"{m}: not a usable manifest: " + "; ".join(bad), file=str(m))
    try:
        specs = tuple(_spec_from_dict(s) for s in doc["specs"])
    except (ValueError, TypeError) as e:
        raise StoreError(f"{m}: specs: {e}", file=str(m)) from None
    return Store(
        dir=d,
        specs=specs,
        partitions=tuple(
            PartitionInfo(p["stem"], int(p["graphs"]), int(p["rows"])) for p in doc["partitions"]
        ),
        source=str(doc.get("source", "")),
        report=dict(doc.get("report", {})),
    )


def write_store(
    batches: Sequence[EcgBatch] | Iterator[EcgBatch],
    directory: str | os.PathLike[str],
    *,
    partition_graphs: int = 100_000,
    report: Mapping[str, Any] | None = None,
    source: str = "",
    overwrite: bool = False,
) -> Store:
    """Write batches as a store, re-cut into partitions of at most ``partition_graphs`` graphs."""
    w = StoreWriter(directory, source=source, overwrite=overwrite)
    for b in batches:
        for g0 in range(0, b.n_graphs, partition_graphs):
            w.append(slice_graphs(b, g0, min(b.n_graphs, g0 + partition_graphs)))
    return w.close(report)
