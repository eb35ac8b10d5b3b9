"""Readers of the Alibaba cluster-trace-microservices call graphs (v2021 ``MSCallGraph``,
v2022 ``CallGraph``) into columnar batches, streaming in bounded memory.

The call tree comes from ``rpcid`` (the parent of ``0.1.2`` is ``0.1``). The traces are
noisy, so every row and graph that cannot be used is counted with a reason
(:class:`~meshtax.traces.report.ImportReport`) and nothing is dropped silently:

- rows without a trace id, with a malformed rpcid, with a non-numeric timestamp or rt, or
  with one out of range (a timestamp beyond ±10^13 ms, an rt beyond ±10^9 ms, i.e. 11 days)
  are dropped (counted);
- rpc/http calls are logged twice (caller side, rt ≥ 0, and callee side, rt ≤ 0 in v2021;
  a caller row and an ``UNKNOWN`` caller row in v2022) and v2022 repeats exact rows: the log
  lines of one rpcid are merged into one invocation, preferring the caller side and filling
  missing names from the other lines (counted as merged, not dropped);
- an rpcid whose parent rpcid is absent (a broken trace: the published estimate is that only
  about 58 % of v2021 traces are connected) is handled by ``orphans``: ``attach`` (default)
  makes it a child of its nearest logged ancestor, or a root when none is logged;
  ``drop-rows`` keeps only what descends from the entry calls; ``drop-graph`` drops the graph;
- the caller of a call is its ``um`` when known, else its parent's callee; a missing callee
  (empty, ``(?)``, ``NAN``, ``UNKNOWN``, ``UNAVAILABLE``) becomes the service ``(unknown)``.

Times are milliseconds in the traces (values below 1 ms are recorded as 0); sizes and rates
are not in the traces and take the options' defaults (the paper's 100 B and 30K requests/s).

Large inputs are hash-partitioned by trace id into temporary Arrow files in a first pass,
then each bucket is turned into graphs: memory is bounded by the bucket size. Files are read
through :mod:`meshtax.safeio` (regular files only; gzip recognised by its magic bytes, with a
decompression limit); a corrupt or truncated file is a :class:`TraceFormatError`.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from meshtax import safeio
from meshtax.errors import InputError
from meshtax.model.ecg import EcgBatch
from meshtax.traces.alibaba_csv import (
    _INVALID_ROWS,
    AlibabaOptions,
    Orphans,
    TraceFormatError,
    Version,
    _empty_table,
    _flush_invalid,
    _stream_tables,
    sniff_version,
)
from meshtax.traces.alibaba_graphs import graphs_from_table
from meshtax.traces.report import ImportReport

__all__ = [
    "AlibabaOptions",
    "Orphans",
    "TraceFormatError",
    "Version",
    "graphs_from_table",
    "iter_alibaba",
    "sniff_version",
]


def _slices(batch: EcgBatch, size: int) -> Iterator[EcgBatch]:
    from meshtax.traces.store import slice_graphs

    if batch.n_graphs <= size:
        if batch.n_graphs:
            yield batch
        return
    for g0 in range(0, batch.n_graphs, size):
        yield slice_graphs(batch, g0, min(batch.n_graphs, g0 + size))


@dataclass
class _Progress:
    """Optional progress callback: (phase, done, total)."""

    cb: Any = None
    done: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.cb is not None:
            self.cb(phase, done, total)


def _uncompressed_estimate(path: Path) -> int:
    size = path.stat().st_size
    return size * 6 if safeio.is_gzip(path) else size  # gzip of these CSVs is ~5-7×


def iter_alibaba(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    version: Version | None = None,
    options: AlibabaOptions = AlibabaOptions(),
    report: ImportReport | None = None,
    progress: Any = None,
) -> Iterator[EcgBatch]:
    """Stream batches of graphs (at most ``options.partition_graphs`` each) from one or more
    Alibaba CSV files (plain or gzip) of one version; rows of one trace may be in several
    files. Counts go to ``report``. ``progress(phase, done, total)`` is called as bytes are read."""
    files = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    if not files:
        raise TraceFormatError("no input files")
    for f in files:
        try:
            safeio.check_regular(f, "an Alibaba trace CSV")
        except InputError as e:
            raise TraceFormatError(str(e), file=str(f)) from None
    ver: Version = version or sniff_version(files[0])
    rep = report if report is not None else ImportReport(", ".join(map(str, files)), ver)
    prog = _Progress(progress)
    total = sum(_uncompressed_estimate(f) for f in files)
    total_disk = sum(f.stat().st_size for f in files)
    K = max(1, -(-total // max(1, options.bucket_bytes)))
    _INVALID_ROWS[0] = 0
    if K == 1:
        tables = []
        for f in files:
            for t in _stream_tables(f, ver, options):
                tables.append(t)
                prog.done += int(t.nbytes)
                prog("read", min(prog.done, total), total)
        _flush_invalid(rep)
        table = pa.concat_tables(tables) if tables else _empty_table()
        yield from _slices(graphs_from_table(table, ver, options, rep), options.partition_graphs)
        return
    with tempfile.TemporaryDirectory(prefix="meshtax-buckets-", dir=options.tmp_dir) as tmp:
        writers: list[pa.ipc.RecordBatchStreamWriter | None] = [None] * K
        sinks: list[Any] = [None] * K
        schema = _empty_table().schema
        done_disk = 0
        try:
            for f in files:
                for t in _stream_tables(f, ver, options):
                    b = _bucket_of(t.column("trace"), K)
                    order = np.argsort(b, kind="stable")
                    bounds = np.searchsorted(b[order], np.arange(K + 1))
                    t = t.take(pa.array(order))
                    for k in range(K):
                        lo, hi = int(bounds[k]), int(bounds[k + 1])
                        if hi <= lo:
                            continue
                        if writers[k] is None:
                            sinks[k] = pa.OSFile(os.path.join(tmp, f"b{k:04d}.arrow"), "wb")
                            writers[k] = pa.ipc.new_stream(sinks[k], schema)
                        w = writers[k]
                        assert w is not None
                        w.write_table(t.slice(lo, hi - lo))
                    done_disk += int(t.nbytes)
                    prog("bucket", min(done_disk, total), total)
        finally:
            for w, s in zip(writers, sinks):
                if w is not None:
                    w.close()
                    s.close()
        _flush_invalid(rep)
        del total_disk
        for k in range(K):
            p = os.path.join(tmp, f"b{k:04d}.arrow")
            if not os.path.exists(p):
                continue
            with pa.memory_map(p) as src:
                table = pa.ipc.open_stream(src).read_all()
            yield from _slices(
                graphs_from_table(table, ver, options, rep), options.partition_graphs
            )
            del table
            os.unlink(p)
            prog("graphs", k + 1, K)


def _bucket_of(trace: pa.ChunkedArray, K: int) -> npt.NDArray[np.int64]:
    """Stable bucket of every row's trace id (crc32 of the id: same bucket in every chunk and file)."""
    enc = pc.dictionary_encode(trace.combine_chunks())
    idx = np.asarray(pc.fill_null(enc.indices, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    h = np.fromiter(
        (zlib.crc32((s or "").encode()) % K for s in enc.dictionary.to_pylist()),
        dtype=np.int64,
        count=len(enc.dictionary),
    )
    return h[idx] if h.size else np.zeros(idx.size, dtype=np.int64)
