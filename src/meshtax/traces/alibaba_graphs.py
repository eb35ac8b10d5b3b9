"""Alibaba rows of whole traces → one columnar :class:`~meshtax.model.ecg.EcgBatch`: rpcid
tree, merged caller/callee log lines, orphans, unknown services; every drop counted."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from meshtax.model.ecg import EcgBatch, SidecarSpec
from meshtax.traces.alibaba_csv import (
    _EXTERNAL_NAMES,
    _MISSING_NAMES,
    _NUM,
    MAX_RT_MS,
    MAX_TIMESTAMP_MS,
    UNKNOWN_SERVICE,
    AlibabaOptions,
    Version,
)
from meshtax.traces.report import ImportReport


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
