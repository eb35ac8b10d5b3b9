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

import contextlib
import os
import re
import sys
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from meshtax import safeio
from meshtax.errors import InputError, TraceError
from meshtax.model.ecg import DEFAULT_MESSAGE_BYTES, DEFAULT_RATE_RPS, EcgBatch, SidecarSpec
from meshtax.model.sidecar import SidecarConfig
from meshtax.traces.report import ImportReport

Version = Literal["alibaba-v2021", "alibaba-v2022"]
Orphans = Literal["attach", "drop-rows", "drop-graph"]

V2021_COLUMNS = ("traceid", "timestamp", "rpcid", "um", "rpctype", "dm", "interface", "rt")
V2022_COLUMNS = (
    "timestamp",
    "traceid",
    "service",
    "rpc_id",
    "rpctype",
    "um",
    "uminstanceid",
    "interface",
    "dm",
    "dminstanceid",
    "rt",
)
# normalized name ← source column, per version
_MAP: dict[str, dict[str, str]] = {
    "alibaba-v2021": {
        "trace": "traceid",
        "ts": "timestamp",
        "rpcid": "rpcid",
        "um": "um",
        "dm": "dm",
        "rpctype": "rpctype",
        "rt": "rt",
    },
    "alibaba-v2022": {
        "trace": "traceid",
        "ts": "timestamp",
        "rpcid": "rpc_id",
        "um": "um",
        "dm": "dm",
        "rpctype": "rpctype",
        "rt": "rt",
    },
}
_MISSING_NAMES = ("", "(?)", "?", "NAN", "NaN", "nan", "UNKNOWN", "UNAVAILABLE", "null", "NULL")
_EXTERNAL_NAMES = ("USER",)
UNKNOWN_SERVICE = "(unknown)"
_NUM = r"^\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$"
#: beyond these a timestamp or rt (ms) is not a time: the row is dropped (counted)
MAX_TIMESTAMP_MS = 1e13
MAX_RT_MS = 1e9


class TraceFormatError(TraceError):
    """An input that cannot be read at all (wrong columns, not CSV, truncated compression)."""


@dataclass(frozen=True)
class AlibabaOptions:
    """Options of the Alibaba readers.

    ``request_bytes``/``response_bytes``/``rate``: values for every call (absent in the traces).
    ``sidecar``: configuration recorded for every service (the study replaces it).
    ``unmeshed_types``: rpctypes whose callee has no sidecar (e.g. ``{"mc", "db"}``); by
    default every callee is meshed, as in the paper's study.
    ``orphans``: what to do with rows whose parent rpcid is missing (see the module doc).
    ``partition_graphs``: graphs per yielded batch. ``bucket_bytes``: input bytes (uncompressed)
    per hash bucket; inputs below it are read in one piece.
    """

    request_bytes: float = DEFAULT_MESSAGE_BYTES
    response_bytes: float = DEFAULT_MESSAGE_BYTES
    rate: float = DEFAULT_RATE_RPS
    sidecar: SidecarConfig = SidecarConfig()
    unmeshed_types: frozenset[str] = frozenset()
    orphans: Orphans = "attach"
    partition_graphs: int = 100_000
    bucket_bytes: int = 256 << 20
    block_bytes: int = 16 << 20
    tmp_dir: str | None = None


def sniff_version(path: str | os.PathLike[str]) -> Version:
    """The schema of an Alibaba CSV from its header line."""
    header = _header(Path(path))
    cols = [c.strip() for c in header]
    if "rpc_id" in cols and "dminstanceid" in cols:
        return "alibaba-v2022"
    if "rpcid" in cols and "traceid" in cols:
        return "alibaba-v2021"
    raise TraceFormatError(
        f"{path}: header {','.join(cols)!r} is neither Alibaba v2021 ({','.join(V2021_COLUMNS)}) "
        f"nor v2022 ({','.join(V2022_COLUMNS)})"
    )


def _header(path: Path) -> list[str]:
    try:
        with safeio.open_stream(path, "an Alibaba trace CSV") as raw:
            line = raw.readline(1 << 16)
    except InputError as e:
        raise TraceFormatError(str(e), file=str(path)) from None
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror or e})") from None
    if not line.strip():
        raise TraceFormatError(f"{path}: empty file (expected a CSV header line)")
    try:
        return [c.strip().strip('"') for c in line.decode().rstrip("\r\n").split(",")]
    except UnicodeDecodeError:
        raise TraceFormatError(f"{path}: not a text CSV file") from None


def _check_columns(path: Path, header: list[str], version: Version) -> None:
    want = V2021_COLUMNS if version == "alibaba-v2021" else V2022_COLUMNS
    have = [c.strip() for c in header]
    missing = [c for c in _MAP[version].values() if c not in have]
    if missing:
        raise TraceFormatError(
            f"{path}: missing column(s) {', '.join(missing)} for {version}; expected header {','.join(want)} "
            f"(optionally with a leading index column), found {','.join(have)}"
        )


def _stream_tables(path: Path, version: Version, opts: AlibabaOptions) -> Iterator[pa.Table]:
    """Chunks of the file as normalized string tables (trace, ts, rpcid, um, dm, rpctype, rt)."""
    header = _header(path)
    _check_columns(path, header, version)
    names = [c.strip() or f"_index{i}" for i, c in enumerate(header)]
    m = _MAP[version]
    need = list(m.values())
    try:
        stream = safeio.open_stream(path, "an Alibaba trace CSV")
    except InputError as e:
        raise TraceFormatError(str(e), file=str(path)) from None
    try:
        quiet = _quiet_bad_rows()
        quiet.__enter__()
        reader = pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(
                column_names=names, skip_rows=1, block_size=opts.block_bytes
            ),
            parse_options=pcsv.ParseOptions(invalid_row_handler=_count_invalid),
            convert_options=pcsv.ConvertOptions(
                column_types={c: pa.string() for c in names},
                include_columns=need,
                strings_can_be_null=False,
            ),
        )
        for rb in reader:
            t = pa.Table.from_batches([rb])
            yield pa.table({k: t.column(v) for k, v in m.items()})
    except InputError as e:  # raised by the stream under pyarrow: decompression
        raise TraceFormatError(str(e), file=str(path)) from None
    except (pa.ArrowException, OSError, EOFError, ValueError) as e:
        why = _arrow_reason(e)
        raise TraceFormatError(
            f"{path}: unreadable ({why}); is the file truncated or not {version} CSV?",
            file=str(path),
        ) from None
    finally:
        quiet.__exit__(None, None, None)
        stream.close()


@contextlib.contextmanager
def _quiet_bad_rows() -> Iterator[None]:
    """pyarrow decodes a malformed row as UTF-8 to hand it to the invalid-row handler; when
    the row is not UTF-8 that fails inside pyarrow, which prints a traceback ("Exception
    ignored") and then fails the read, which we report cleanly. Keep the traceback quiet."""
    old = sys.unraisablehook

    def hook(u: Any) -> None:
        if isinstance(u.exc_value, UnicodeDecodeError) and u.object is _count_invalid:
            return
        old(u)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = old


def _arrow_reason(e: BaseException) -> str:
    """pyarrow's message without the Python traceback it appends for errors raised in a
    Python file object, and without quoting the data."""
    text = str(e).split("\n", 1)[0]
    if "InputError" in text or "zlib" in text or "decompress" in text.lower():
        return "corrupt or truncated compressed data"
    # "Expected 11 columns, got 10: <the row>": the row is the file's content, not quoted
    m = re.match(r"(.*?(?:columns?|fields?), got \d+)", text)
    if m:
        return m.group(1)
    return text.split(": ", 2)[0][:160] if len(text) > 160 else text


_INVALID_ROWS = [0]


def _count_invalid(row: Any) -> str:
    # rows with the wrong number of fields: counted, skipped (the count is read per file)
    _INVALID_ROWS[0] += 1
    return "skip"


def _to_float(a: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.float64]:
    """Numbers of a string column; NaN where a value is not a number."""
    arr = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
    ok = pc.match_substring_regex(arr, _NUM)
    clean = pc.if_else(ok, arr, pa.scalar(None, pa.string()))
    v = pc.cast(pc.utf8_trim_whitespace(clean), pa.float64()).to_numpy(zero_copy_only=False)
    return np.asarray(v, dtype=np.float64)


def _missing(a: pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(
        pc.fill_null(pc.is_in(a, value_set=pa.array(_MISSING_NAMES)), True).to_numpy(
            zero_copy_only=False
        ),
        dtype=bool,
    )


def _first_of_groups(sorted_keys: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    first = np.ones(sorted_keys.size, dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return first


def graphs_from_table(
    table: pa.Table, version: Version, opts: AlibabaOptions, report: ImportReport
) -> EcgBatch:
    """Turn the rows of whole traces (normalized string columns) into a batch; counts into ``report``."""
    table = table.combine_chunks()
    n = table.num_rows
    report.rows_read += n
    trace = (
        table.column("trace").chunk(0)
        if table.column("trace").num_chunks
        else pa.array([], pa.string())
    )
    rpc = table.column("rpcid").combine_chunks()
    trace_ok = ~_missing(trace) if n else np.zeros(0, bool)
    all_traces = pc.unique(pc.filter(trace, pa.array(trace_ok))) if n else pa.array([], pa.string())
    report.graphs_seen += len(all_traces)
    rpc_ok = np.asarray(
        pc.fill_null(pc.match_substring_regex(rpc, r"^[0-9]+(\.[0-9]+)*$"), False).to_numpy(
            zero_copy_only=False
        ),
        bool,
    )
    ts = _to_float(table.column("ts"))
    rt = _to_float(table.column("rt"))
    ok = np.ones(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        ts_range = np.abs(ts) <= MAX_TIMESTAMP_MS
        rt_range = np.abs(rt) <= MAX_RT_MS
    for reason, bad in (
        ("missing trace id", ~trace_ok),
        ("malformed rpcid", ~rpc_ok),
        ("non-numeric timestamp", ~np.isfinite(ts)),
        ("non-numeric rt", ~np.isfinite(rt)),
        (f"timestamp beyond ±{MAX_TIMESTAMP_MS:g} ms", np.isfinite(ts) & ~ts_range),
        (f"rt beyond ±{MAX_RT_MS:g} ms", np.isfinite(rt) & ~rt_range),
    ):
        hit = ok & bad
        if hit.any():
            report.dropped_rows[reason] += int(hit.sum())
        ok &= ~bad
    sel = pa.array(ok)
    trace, rpc = pc.filter(trace, sel), pc.filter(rpc, sel)
    um, dm, rtype = (
        pc.filter(table.column(k).combine_chunks(), sel) for k in ("um", "dm", "rpctype")
    )
    ts, rt = ts[ok], rt[ok]
    m = len(trace)
    # traces whose every row was unusable
    used_traces = pc.unique(trace)
    lost = len(all_traces) - len(used_traces)
    if lost:
        report.dropped_graphs["no usable rows"] += lost
    empty = _empty_batch(opts)
    if m == 0:
        return empty

    enc = pc.dictionary_encode(trace)
    tcode = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    tnames = enc.dictionary
    rdict = pc.unique(rpc)
    R = len(rdict)
    rcode = np.asarray(
        pc.index_in(rpc, value_set=rdict).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    key = tcode * R + rcode
    um_missing = _missing(um)
    dm_missing = _missing(dm)
    um_external = np.asarray(
        pc.is_in(um, value_set=pa.array(_EXTERNAL_NAMES)).to_numpy(zero_copy_only=False), bool
    )

    # --- merge the log lines of one call: lines of one rpcid with the same callee (or none
    # logged) are one call; the same rpcid with different callees (v2021 memcached fan-out)
    # are separate sibling calls. Prefer the caller side (rt ≥ 0, known caller).
    dm_codes = np.asarray(
        pc.dictionary_encode(dm).indices.to_numpy(zero_copy_only=False), dtype=np.int64
    )
    dmc = np.where(dm_missing, -1, dm_codes)
    o1 = np.lexsort((dm_missing, key))
    first_known = np.full(m, -1, dtype=np.int64)
    f1 = _first_of_groups(key[o1])
    grp1 = np.cumsum(f1) - 1
    head = o1[f1]
    first_known_of_group = np.where(dm_missing[head], -1, dmc[head])
    first_known[o1] = first_known_of_group[grp1]
    dmc = np.where(dm_missing, first_known, dmc)
    score = (rt < 0).astype(np.int64) * 2 + um_missing
    order = np.lexsort((np.arange(m), score, dmc, key))
    first = np.ones(m, dtype=bool)
    first[1:] = (key[order][1:] != key[order][:-1]) | (dmc[order][1:] != dmc[order][:-1])
    rep = order[first]
    group_of_sorted = np.cumsum(first) - 1
    report.rows_merged += int(m - rep.size)
    # fill a missing callee/caller from another line of the same call
    dm_idx = _fill_from_group(rep, order, group_of_sorted, dm_missing)
    um_idx = _fill_from_group(rep, order, group_of_sorted, um_missing | um_external)

    N = rep.size
    node_key = key[rep]  # sorted ascending (rep follows the sort)
    node_trace = tcode[rep]
    node_rpc = pc.take(rpc, pa.array(rep))
    depth = np.asarray(
        pc.count_substring(node_rpc, ".").to_numpy(zero_copy_only=False), dtype=np.int64
    )
    # nearest logged ancestor, one rpcid segment at a time
    parent = np.full(N, -1, dtype=np.int64)
    direct = np.zeros(N, dtype=bool)
    pending = np.flatnonzero(depth > 0)
    cur = pc.take(node_rpc, pa.array(pending))
    step = 0
    while pending.size:
        cur = pc.replace_substring_regex(cur, r"\.[0-9]+$", "")
        code = pc.index_in(cur, value_set=rdict)
        c = np.asarray(pc.fill_null(code, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        q = node_trace[pending] * R + c
        # several calls may share an rpcid (different callees): the first one is the parent
        pos = np.minimum(np.searchsorted(node_key, q), N - 1)
        found = (c >= 0) & (node_key[pos] == q)
        parent[pending[found]] = pos[found]
        if step == 0:
            direct[pending[found]] = True
        step += 1
        more = ~found & (
            np.asarray(pc.count_substring(cur, ".").to_numpy(zero_copy_only=False)) > 0
        )
        pending = pending[more]
        cur = pc.filter(cur, pa.array(more))
    is_orphan = (depth > 0) & ~direct  # parent rpcid not logged
    entry = (depth <= 1) & (parent < 0)  # "0" or a "0.k" without a logged "0": entry calls
    keep = np.ones(N, dtype=bool)
    G = len(tnames)
    orphan_traces = np.bincount(node_trace[is_orphan & ~entry], minlength=G) > 0
    if opts.orphans == "drop-graph":
        drop_t = orphan_traces
        keep = ~drop_t[node_trace]
        if drop_t.any():
            report.dropped_graphs["disconnected (an rpcid's parent is missing)"] += int(
                drop_t.sum()
            )
            report.dropped_rows["in a dropped graph"] += int((~keep).sum())
    elif opts.orphans == "drop-rows":
        # reachable from entry calls through logged parents only
        reach = entry.copy()
        parent = np.where(direct, parent, -1)
        for d in range(1, int(depth.max()) + 1):
            at = np.flatnonzero((depth == d) & (parent >= 0))
            reach[at] = reach[parent[at]]
        keep = reach
        if (~keep).any():
            report.dropped_rows["not connected to an entry call"] += int((~keep).sum())
    else:
        att = is_orphan & (parent >= 0)
        if att.any():
            report.notes["parent rpcid missing: attached to nearest logged ancestor"] += int(
                att.sum()
            )
        promoted = is_orphan & (parent < 0) & ~entry
        if promoted.any():
            report.notes["no logged ancestor: taken as a root"] += int(promoted.sum())
    kept_per_trace = np.bincount(node_trace[keep], minlength=G)
    dropped_per_trace = np.bincount(node_trace[~keep], minlength=G)
    if opts.orphans == "drop-rows":
        none = (kept_per_trace == 0) & (dropped_per_trace > 0)
        if none.any():
            report.dropped_graphs["no entry call (every rpcid's ancestors missing)"] += int(
                none.sum()
            )
    report.graphs_partial += int(((kept_per_trace > 0) & (dropped_per_trace > 0)).sum())
    report.graphs_kept += int((kept_per_trace > 0).sum())

    # --- order kept calls: by graph, depth (parents first), start, rpcid
    kept = np.flatnonzero(keep)
    k_ts = ts[rep][kept]
    o = np.lexsort((node_key[kept], k_ts, depth[kept], node_trace[kept]))
    rows = kept[o]
    newpos = np.full(N, -1, dtype=np.int64)
    newpos[rows] = np.arange(rows.size)
    par = parent[rows]
    par_new = np.where(par >= 0, newpos[np.maximum(par, 0)], -1)
    report.rows_used += int(rows.size)

    # --- services
    callee_name = pc.take(dm, pa.array(dm_idx[rows]))
    callee_name = pc.if_else(
        pa.array(dm_missing[dm_idx[rows]]), pa.scalar(UNKNOWN_SERVICE), callee_name
    )
    u_rows = um_idx[rows]
    caller_known = ~(um_missing[u_rows] | um_external[u_rows])
    caller_name = pc.take(um, pa.array(u_rows))
    svc_dict = pc.unique(
        pa.concat_arrays([callee_name, pc.filter(caller_name, pa.array(caller_known))])
    )
    callee = np.asarray(
        pc.index_in(callee_name, value_set=svc_dict).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    caller_own = np.asarray(
        pc.fill_null(pc.index_in(caller_name, value_set=svc_dict), -1).to_numpy(
            zero_copy_only=False
        ),
        dtype=np.int64,
    )
    parent_callee = np.where(par_new >= 0, callee[np.maximum(par_new, 0)], -1)
    caller = np.where(caller_known, caller_own, parent_callee)
    filled = (~caller_known) & (par_new >= 0)
    if filled.any():
        report.notes["caller unknown: taken from the parent's callee"] += int(filled.sum())
    mismatch = caller_known & (par_new >= 0) & (caller_own != parent_callee)
    if mismatch.any():
        report.notes["caller differs from the parent's callee (kept the logged caller)"] += int(
            mismatch.sum()
        )
    if (dm_missing[dm_idx[rows]]).any():
        report.notes[f"callee unknown: named {UNKNOWN_SERVICE}"] += int(
            dm_missing[dm_idx[rows]].sum()
        )

    g_of_row = node_trace[rows]
    counts = np.bincount(g_of_row, minlength=G)
    present = np.flatnonzero(counts)
    gmap = np.full(G, -1, dtype=np.int64)
    gmap[present] = np.arange(present.size)
    ptr = np.zeros(present.size + 1, dtype=np.int64)
    np.cumsum(counts[present], out=ptr[1:])
    t_ms = ts[rep][rows]
    t0 = np.full(G, np.inf)
    np.minimum.at(t0, g_of_row, t_ms)
    start_us = (t_ms - t0[g_of_row]) * 1000.0
    dur_us = np.abs(rt[rep][rows]) * 1000.0
    rtypes = pc.take(rtype, pa.array(rep[rows]))
    meshed_callee = ~np.asarray(
        pc.is_in(rtypes, value_set=pa.array(sorted(opts.unmeshed_types), pa.string())).to_numpy(
            zero_copy_only=False
        ),
        bool,
    )
    spec = np.zeros(1, np.int64)
    nrows = rows.size
    return EcgBatch(
        graph_ptr=ptr,
        parent=par_new,
        caller=caller,
        callee=callee,
        caller_spec=np.where(caller >= 0, spec[0], -1),
        callee_spec=np.where(meshed_callee, spec[0], -1),
        request_bytes=np.full(nrows, float(opts.request_bytes)),
        response_bytes=np.full(nrows, float(opts.response_bytes)),
        rate=np.full(nrows, float(opts.rate)),
        start_us=start_us,
        duration_us=dur_us,
        services=tuple(svc_dict.to_pylist()),
        specs=(SidecarSpec(opts.sidecar),),
        graph_names=tuple(pc.take(tnames, pa.array(present)).to_pylist()),
    )


def _fill_from_group(
    rep: npt.NDArray[np.int64],
    order: npt.NDArray[np.int64],
    group_of_sorted: npt.NDArray[np.int64],
    missing: npt.NDArray[np.bool_],
) -> npt.NDArray[np.int64]:
    """Per group, the representative row if its value is present, else any row of the group with one."""
    out = rep.copy()
    need = missing[rep]
    if need.any():
        cand = ~missing[order]
        gs = group_of_sorted[cand]
        donor = np.full(rep.size, -1, dtype=np.int64)
        donor[gs[::-1]] = order[cand][::-1]  # first candidate per group wins
        fix = need & (donor >= 0)
        out[fix] = donor[fix]
    return out


def _empty_batch(opts: AlibabaOptions) -> EcgBatch:
    z = np.zeros(0, dtype=np.int64)
    f = np.zeros(0)
    return EcgBatch(
        np.zeros(1, np.int64), z, z, z, z, z, f, f, f, f, f, (), (SidecarSpec(opts.sidecar),), ()
    )


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


def _flush_invalid(rep: ImportReport) -> None:
    if _INVALID_ROWS[0]:
        rep.dropped_rows["wrong number of fields"] += _INVALID_ROWS[0]
        rep.rows_read += _INVALID_ROWS[0]
        _INVALID_ROWS[0] = 0


def _empty_table() -> pa.Table:
    return pa.table(
        {
            k: pa.array([], pa.string())
            for k in ("trace", "ts", "rpcid", "um", "dm", "rpctype", "rt")
        }
    )


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
