"""Seeded synthetic Alibaba-like call graphs, written in the v2021 or v2022 CSV schema so the
same readers consume them.

Calibrated to the published statistics of the Alibaba traces (Luo et al., SoCC '21):
call-graph depth mean ≈ 4.27 and sd ≈ 3.25 with over 4 % deeper than 10; over 10 % of graphs
with more than 40 microservices; fan-out mean ≈ 4 with mode 3 and roughly a tenth above 10;
call types dominated by rpc and memcached, then http, db and mq; sibling start spread and
response times with heavy tails. The generator draws a depth per graph and grows a spine
to it, so depth is exact by construction; other branches continue with a small probability.

Generation is vectorized level by level over chunks of graphs (a million graphs take tens of
seconds), and the output is grouped by trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

Version = Literal["alibaba-v2021", "alibaba-v2022"]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# call types: codes into this tuple
TYPES = ("rpc", "http", "mc", "db", "mq")
_INTERNAL_TYPE_P = np.array([0.85, 0.15, 0.0, 0.0, 0.0])
_LEAF_TYPE_P = np.array([0.30, 0.07, 0.46, 0.12, 0.05])
_BRANCH_P = 0.10  # chance that a non-spine child of an inner call makes calls itself
_N_SERVICES = 20_000
_N_STORES = 3_000
_WINDOW_MS = 12 * 3600 * 1000  # the v2021 release covers 12 hours


@dataclass(frozen=True)
class GenerateSummary:
    """What :func:`generate` wrote."""

    path: Path
    version: str
    graphs: int
    calls: int
    rows: int
    seed: int
    broken_graphs: int


def _depths(rng: np.random.Generator, n: int) -> IntArray:
    # 1 + a rounded gamma: mean ≈ 4.27, sd ≈ 3.25, P(depth > 10) ≈ 5 %
    return (1 + np.floor(rng.gamma(1.3, 2.95, n))).astype(np.int64)


def _fanouts(rng: np.random.Generator, n: int) -> IntArray:
    # mode 3 body plus a heavy tail above 10: mean ≈ 4, ≈ 10 % above 10
    body = 1 + rng.binomial(4, 0.5, n)  # 1..5, mode 3
    tail = 11 + rng.geometric(0.2, n) - 1  # 11, 12, … (mean 15)
    f = np.where(rng.random(n) < 0.095, tail, body)
    return np.asarray(f, dtype=np.int64)


@dataclass
class _Calls:
    graph: IntArray
    parent: IntArray  # index into the chunk's calls, -1 for roots
    seq: IntArray  # 1-based position among siblings (rpcid's last segment)
    level: IntArray
    kind: IntArray
    svc: IntArray
    start: FloatArray  # ms
    dur: FloatArray  # ms


def _grow(rng: np.random.Generator, n: int) -> _Calls:
    """Call trees of ``n`` graphs as flat arrays, parents before children."""
    depth = _depths(rng, n)
    # level 0: the entry call of each graph (from the user, over http)
    g = np.arange(n, dtype=np.int64)
    start = rng.integers(0, _WINDOW_MS, n).astype(np.float64)
    dur = np.maximum(1.0, np.floor(rng.lognormal(np.log(25.0), 1.1, n)))
    parts = [
        _Calls(
            g,
            np.full(n, -1, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.full(n, 1, np.int64),
            rng.integers(0, 400, n),
            start,
            dur,
        )
    ]
    inner = depth > 1
    spine = np.ones(n, dtype=bool)
    offset = 0
    level = 0
    cur = parts[0]
    while True:
        par = np.flatnonzero(inner)
        if par.size == 0:
            break
        f = _fanouts(rng, par.size)
        pidx = np.repeat(par, f)
        k = np.arange(pidx.size) - np.repeat(np.cumsum(f) - f, f)  # 0-based sibling index
        cg = cur.graph[pidx]
        m = pidx.size
        lvl = level + 1
        can = lvl < depth[cg] - 1  # a call at this level may still call deeper
        child_spine = spine[pidx] & (k == 0)
        child_inner = can & (child_spine | (rng.random(m) < _BRANCH_P))
        kind = np.where(
            child_inner,
            rng.choice(len(TYPES), m, p=_INTERNAL_TYPE_P),
            rng.choice(len(TYPES), m, p=_LEAF_TYPE_P),
        )
        svc = np.where(
            kind <= 1,
            400 + (rng.pareto(1.2, m) * 300).astype(np.int64) % (_N_SERVICES - 400),
            rng.integers(0, _N_STORES, m),
        )
        # sibling starts: half the parents call in parallel (starts bunched at the beginning),
        # the others spread calls over their time (sequential-looking); heavy-tailed times
        p_start, p_dur = cur.start[pidx], cur.dur[pidx]
        spread = np.where(rng.random(par.size) < 0.5, 0.15, 0.9)[np.repeat(np.arange(par.size), f)]
        s = p_start + np.floor(p_dur * spread * rng.beta(0.8, 1.6, m))
        room = p_start + p_dur - s
        want = np.where(
            kind >= 2,
            np.floor(rng.lognormal(np.log(0.4), 1.2, m)),  # stores: mostly below 1 ms → 0
            np.floor(room * rng.beta(1.3, 2.2, m)),
        )
        d = np.clip(want, 0.0, room)
        nxt = _Calls(cg, pidx + offset, k + 1, np.full(m, lvl), kind, svc, s, d)
        parts.append(nxt)
        offset += cur.graph.size
        cur = nxt
        inner = child_inner
        spine = child_spine
        level = lvl
    return _Calls(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in _Calls.__dataclass_fields__)
    )


def _rpcids(c: _Calls) -> pa.Array:
    """rpcid strings: the entry call is "0", its children "0.1", "0.2", …"""
    # levels are contiguous and in order, so build them one after the other
    bounds = np.searchsorted(c.level, np.arange(int(c.level.max()) + 2))
    pieces: list[pa.Array] = []
    done: pa.Array = pa.array([], pa.string())
    for lvl in range(int(c.level.max()) + 1):
        lo, hi = int(bounds[lvl]), int(bounds[lvl + 1])
        if lvl == 0:
            piece = pa.array(np.full(hi - lo, "0", dtype=object), pa.string())
        else:
            prefix = pc.take(done, pa.array(c.parent[lo:hi]))
            piece = pc.binary_join_element_wise(
                prefix, pc.cast(pa.array(c.seq[lo:hi]), pa.string()), "."
            )
        pieces.append(piece)
        done = pa.concat_arrays([done, piece])
    return done


def _names(prefix: str, kind: IntArray, svc: IntArray) -> pa.Array:
    base = pc.cast(pa.array(svc), pa.string())
    kprefix = np.array([prefix, prefix, "MC_", "DB_", "MQ_"], dtype=object)[kind]
    return pc.binary_join_element_wise(pa.array(kprefix, pa.string()), base, "")


def _tables(
    rng: np.random.Generator, c: _Calls, version: Version, g0: int, seed: int, broken: float
) -> tuple[pa.Table, int, int]:
    n = c.graph.size
    rpc = _rpcids(c)
    # break some graphs: drop one non-entry inner call's lines (its children become orphans)
    keep = np.ones(n, dtype=bool)
    n_broken = 0
    if broken > 0:
        has_kids = np.zeros(n, dtype=bool)
        has_kids[c.parent[c.parent >= 0]] = True
        cand = np.flatnonzero(has_kids & (c.parent >= 0))
        graphs = np.unique(c.graph)
        pick = graphs[rng.random(graphs.size) < broken]
        cg = c.graph[cand]
        chosen = cand[np.isin(cg, pick)]
        if chosen.size:
            first = np.unique(c.graph[chosen], return_index=True)[1]
            keep[chosen[first]] = False
            n_broken = int(first.size)
    svc_prefix = "MS_" if version == "alibaba-v2022" else "ms"
    dm = _names(svc_prefix, c.kind, c.svc)
    parent_safe = np.maximum(c.parent, 0)
    um = pc.if_else(
        pa.array(c.parent < 0),
        pa.scalar("USER" if version == "alibaba-v2022" else ""),
        pc.take(dm, pa.array(parent_safe)),
    )
    gid = c.graph + g0
    ts = np.floor(c.start).astype(np.int64)
    rt = c.dur
    kind_s = pc.take(pa.array(TYPES), pa.array(c.kind))
    # rpc/http calls are also logged by the callee
    twice = (c.kind <= 1) & keep
    if version == "alibaba-v2021":
        trace = pc.binary_join_element_wise(
            pa.scalar(f"0b{seed % 0xFFFF:04x}"), pc.cast(pa.array(gid), pa.string()), ""
        )
        caller_rt = rt.astype(np.int64)
        callee_rt = -np.maximum(rt - rng.integers(0, 2, n), 0).astype(np.int64)
        iface = pc.binary_join_element_wise(
            pa.scalar("if"), pc.cast(pa.array(c.svc % 97), pa.string()), ""
        )
        a = pa.table(
            {
                "traceid": trace,
                "timestamp": ts,
                "rpcid": rpc,
                "um": um,
                "rpctype": kind_s,
                "dm": dm,
                "interface": iface,
                "rt": caller_rt,
            }
        )
        b = pa.table(
            {
                "traceid": trace,
                "timestamp": ts,
                "rpcid": rpc,
                "um": um,
                "rpctype": kind_s,
                "dm": dm,
                "interface": iface,
                "rt": callee_rt,
            }
        )
        # the callee often does not know its caller
        b = b.set_column(
            3, "um", pc.if_else(pa.array(rng.random(n) < 0.3), pa.scalar("(?)"), b.column("um"))
        )
    else:
        trace = pc.binary_join_element_wise(
            pa.scalar("T_"), pc.cast(pa.array(gid), pa.string()), ""
        )
        root_svc = c.svc[c.graph]  # row g of level 0 is the entry call of graph g
        service = pc.binary_join_element_wise(
            pa.scalar("S_"), pc.cast(pa.array(root_svc), pa.string()), ""
        )
        pod_u = pc.binary_join_element_wise(
            um, pc.cast(pa.array(rng.integers(0, 50, n)), pa.string()), "_POD_"
        )
        pod_u = pc.if_else(pa.array(c.parent < 0), pa.scalar("USER"), pod_u)
        pod_d = pc.binary_join_element_wise(
            dm, pc.cast(pa.array(rng.integers(0, 50, n)), pa.string()), "_POD_"
        )
        iface = pc.binary_join_element_wise(
            pa.scalar("if"), pc.cast(pa.array(c.svc % 97), pa.string()), ""
        )
        cols = {
            "timestamp": ts,
            "traceid": trace,
            "service": service,
            "rpc_id": rpc,
            "rpctype": kind_s,
            "um": um,
            "uminstanceid": pod_u,
            "interface": iface,
            "dm": dm,
            "dminstanceid": pod_d,
            "rt": rt.astype(np.float64),
        }
        a = pa.table(cols)
        b = a.set_column(5, "um", pa.array(np.full(n, "UNKNOWN", dtype=object), pa.string()))
        b = b.set_column(
            6, "uminstanceid", pa.array(np.full(n, "UNAVAILABLE", dtype=object), pa.string())
        )
        b = b.set_column(
            10, "rt", pa.array(np.maximum(rt - rng.integers(0, 2, n), 0).astype(np.float64))
        )
        # exact duplicate lines, as in the release
        twice_b = twice
        dup = (rng.random(n) < 0.05) & keep
        a = pa.concat_tables([a, a.filter(pa.array(dup))])
        gid = np.concatenate([gid, gid[dup]])
        keep = np.concatenate([keep, keep[dup]])
        twice = twice_b
    b = b.filter(pa.array(twice))
    t = pa.concat_tables([a.filter(pa.array(keep)), b])
    order_key = np.concatenate([gid[keep], (c.graph + g0)[twice]])
    t = t.take(pa.array(np.argsort(order_key, kind="stable")))
    return t, n_broken, int(keep[: c.graph.size].sum())


def generate(
    n_graphs: int,
    seed: int,
    version: Version,
    out_path: str | os.PathLike[str],
    *,
    broken_fraction: float = 0.0,
    chunk_graphs: int = 100_000,
    progress: Callable[[int, int], None] | None = None,
) -> GenerateSummary:
    """Write ``n_graphs`` synthetic call graphs as an Alibaba CSV of ``version``.

    Same seed → byte-identical output. ``broken_fraction``: share of graphs in which one inner
    call's log lines are removed (as in the real, partly disconnected traces). A path ending in
    ``.gz`` is gzip-compressed; v2021 output carries the release's leading unnamed index column.
    ``progress(done_graphs, total)`` is called after every chunk.
    """
    if version not in ("alibaba-v2021", "alibaba-v2022"):
        raise ValueError(f"version {version!r}: expected alibaba-v2021 or alibaba-v2022")
    if n_graphs < 0:
        raise ValueError("n_graphs must be ≥ 0")
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sink: pa.NativeFile = pa.OSFile(str(path), "wb")
    if path.suffix == ".gz":
        sink = pa.CompressedOutputStream(sink, "gzip")
    calls = rows = broken = 0
    index = 0
    writer: pcsv.CSVWriter | None = None
    try:
        for g0 in range(0, max(n_graphs, 1), chunk_graphs):
            n = min(chunk_graphs, n_graphs - g0)
            if n <= 0:
                break
            c = _grow(rng, n)
            t, nb, nc = _tables(rng, c, version, g0, seed, broken_fraction)
            calls += nc
            broken += nb
            if version == "alibaba-v2021":
                t = pa.table(
                    {
                        "": pa.array(np.arange(index, index + t.num_rows)),
                        **{k: t.column(k) for k in t.column_names},
                    }
                )
                index += t.num_rows
            rows += t.num_rows
            if writer is None:
                sink.write((",".join(t.column_names) + "\n").encode())  # unquoted, like the release
                writer = pcsv.CSVWriter(
                    sink,
                    t.schema,
                    write_options=pcsv.WriteOptions(include_header=False, quoting_style="none"),
                )
            writer.write_table(t)
            if progress is not None:
                progress(g0 + n, n_graphs)
        if writer is None:
            cols = (
                ["", "traceid", "timestamp", "rpcid", "um", "rpctype", "dm", "interface", "rt"]
                if version == "alibaba-v2021"
                else [
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
                ]
            )
            sink.write((",".join(cols) + "\n").encode())
    finally:
        if writer is not None:
            writer.close()
        sink.close()
    return GenerateSummary(path, version, n_graphs, calls, rows, seed, broken)
