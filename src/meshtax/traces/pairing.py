"""Spans → calls, vectorized over a batch of whole traces (NumPy; one dictionary join on ids).

The rule (OpenTelemetry semantic conventions):

- one RPC is one hop. A server (or consumer) span whose nearest non-internal ancestor is a
  client (or producer) span answers that client; the hop's start and duration are the
  client's (what the caller waits for), the callee is the server's service.
- a client span wrapping other client spans of its service (an RPC client over an HTTP
  client) is one hop with them: the outermost client span is the call, the server that
  answers any of them is the callee. Sizes, peer and protocol come from all of them.
- a client span nobody answers calls an uninstrumented service named by ``peer.service``,
  ``server.address``, ``net.peer.name``, ``rpc.service`` or ``db.system``; without one it
  is dropped (counted).
- a server span without a client above it is an entry call (caller outside the graph); under
  another call it is made by that call's callee (counted).
- internal spans are never hops: they are walked through.
- a consumer span answering a producer span is an **asynchronous** hop: a root of the graph
  of its own (the producer does not wait for it), timed by the consumer span; such hops are
  listed in :attr:`Paired.asynchronous` and counted in the report. The graph's end-to-end
  latency then runs to the last root's end: the request and the work it left behind.
- times are integer nanoseconds until each graph's origin is subtracted. A hop outside its
  parent's interval (clock skew) is clamped into it when it sticks out by at most
  ``SpanOptions.max_skew_us``, else the trace is dropped (counted).

Every span ends up used (a hop), merged into a hop, walked through (internal), or dropped
with a reason in the :class:`~meshtax.traces.report.ImportReport`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from meshtax.model.ecg import EcgBatch, SidecarSpec
from meshtax.model.sidecar import SidecarConfig
from meshtax.traces.decode import CLIENT, CONSUMER, INTERNAL, PRODUCER, SERVER, Row
from meshtax.traces.report import ImportReport

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

R_DUPLICATE = "duplicate span id (kept the last)"
R_UNANSWERED = "client span without a server span or peer name"
R_IN_DROPPED = "span of a dropped trace"
G_NO_CALLS = "no client/server span pairs (only internal spans?)"
G_CYCLE = "span parent links form a cycle"
G_NO_NAME = "a call without a service name"
N_MISSING_PARENT = "parent span missing: taken as a root"
N_INTERNAL = "internal spans walked through"
N_NESTED = "client spans nested in a client span of their service: one call"
N_EXTRA_SERVER = "a second server span under one client span: a call of its own"
N_SERVER_UNDER = "server span without a client span: caller taken from the enclosing call"
N_SHARED_ID = "spans under their caller's client span (a shared span id): moved under its server"
N_CALLER = "caller differs from the enclosing call's callee: used the callee"
N_CLAMPED = "call outside its parent's interval (clock skew?): clamped"
N_ASYNC = "asynchronous producer→consumer calls: roots of their own, off the producer's path"
N_NO_REQ = "request size absent: default used"
N_NO_RESP = "response size absent: default used"


def g_skew(bound_us: float) -> str:
    return f"a call outside its parent's interval by more than {bound_us:g} µs (clock skew)"


@dataclass(frozen=True)
class Naming:
    """Service names and sidecars: a tracer's name → the graph's name, name → sidecar."""

    rename: Callable[[str], str]
    sidecar: Callable[[str], SidecarConfig]


@dataclass(frozen=True)
class Paired:
    """Call graphs of one batch of traces. ``batch.rate`` is NaN where rates are still to be
    counted (:func:`fill_rates`); ``origin_ns`` is each graph's time zero (epoch ns) and
    ``end_ns`` its last end; ``asynchronous`` marks the rows of asynchronous hops."""

    batch: EcgBatch
    origin_ns: I64
    end_ns: I64
    asynchronous: B
    nodes: dict[str, str] = field(default_factory=dict)  # trace service name → its node


def _depth(parent: I64) -> tuple[I64, B]:
    """Depth of every row in the forest ``parent`` (-1: root) by pointer doubling, and the
    rows that lie on or under a cycle."""
    n = parent.size
    d = (parent >= 0).astype(np.int64)
    j = parent.copy()
    for _ in range(max(1, math.ceil(math.log2(n + 1))) + 1):
        m = j >= 0
        if not m.any():
            break
        jm = j[m]
        d[m] += d[jm]
        j[m] = j[jm]
    return d, j >= 0


def pair(
    rows: Sequence[Row],
    report: ImportReport,
    naming: Naming,
    rate: float | None,
    max_skew_us: float,
    default_req: float,
    default_resp: float,
) -> Paired:
    """Turn the span rows of whole traces into one columnar batch of call graphs (parents
    found by a join on (trace id, span id))."""
    if not rows:
        return empty()
    c_trace, c_span, c_parent, c_svc, c_kind, c_start, c_dur, c_req, c_resp, c_peer, c_proto = zip(
        *rows, strict=True
    )
    n_read = len(rows)
    tmap: dict[str, int] = {}
    trace = np.fromiter((tmap.setdefault(t, len(tmap)) for t in c_trace), np.int64, n_read)
    keys = [f"{t}\x00{s}" for t, s in zip(c_trace, c_span, strict=True)]
    index = dict(zip(keys, range(n_read), strict=True))
    dup: B | None = None
    if len(index) != n_read:  # duplicates: the last of each id wins
        dup = np.ones(n_read, dtype=bool)
        dup[np.fromiter(index.values(), np.int64, len(index))] = False
    par = np.array(
        [index.get(f"{t}\x00{p}", -1) if p else -2 for t, p in zip(c_trace, c_parent, strict=True)],
        dtype=np.int64,
    )
    del keys, index
    nmap: dict[str, int] = {"": -1}
    svc = np.fromiter((nmap.setdefault(s, len(nmap) - 1) for s in c_svc), np.int64, n_read)
    peer = np.fromiter((nmap.setdefault(s, len(nmap) - 1) for s in c_peer), np.int64, n_read)
    return pair_columns(
        SpanColumns(
            trace,
            list(tmap),
            c_span,
            par,
            svc,
            peer,
            list(nmap)[1:],
            c_kind,
            c_start,
            c_dur,
            c_req,
            c_resp,
            c_proto,
            dup,
        ),
        report,
        naming,
        rate,
        max_skew_us,
        default_req,
        default_resp,
    )


@dataclass
class SpanColumns:
    """Spans of whole traces as columns: ``trace`` indexes ``trace_names``; ``parent`` is a
    row (-1: the parent is missing, -2: none); ``service``/``peer`` index ``names`` (-1:
    none); ``duplicate`` marks rows whose span id came again (the last one is kept)."""

    trace: I64
    trace_names: list[str]
    span_ids: Sequence[str] | npt.NDArray[np.object_]
    parent: I64
    service: I64
    peer: I64
    names: list[str]
    kind: Any
    start: Any
    dur: Any
    req: Any
    resp: Any
    proto: Any
    duplicate: B | None = None


def pair_columns(
    cols: SpanColumns,
    report: ImportReport,
    naming: Naming,
    rate: float | None,
    max_skew_us: float,
    default_req: float,
    default_resp: float,
) -> Paired:
    """The vectorized pairing of :class:`SpanColumns` (the rule is the module's)."""
    trace, trace_names, par = cols.trace, cols.trace_names, cols.parent
    n_read = trace.size
    report.rows_read += n_read
    report.graphs_seen += len(trace_names)
    kind = np.asarray(cols.kind, dtype=np.int8)
    start = np.asarray(cols.start, dtype=np.int64)
    dur = np.asarray(cols.dur, dtype=np.int64)
    req = np.asarray(cols.req, dtype=np.float64)
    resp = np.asarray(cols.resp, dtype=np.float64)
    proto = np.asarray(cols.proto, dtype=np.int8)
    svc, peer = cols.service, cols.peer
    span_ids: Any = cols.span_ids
    if cols.duplicate is not None:
        keep_rows = np.flatnonzero(~cols.duplicate)
        report.dropped_rows[R_DUPLICATE] += n_read - keep_rows.size
        remap = np.full(n_read, -1, dtype=np.int64)
        remap[keep_rows] = np.arange(keep_rows.size)
        # a child of a dropped duplicate hangs under the kept span of that id
        par = np.where(par >= 0, remap[np.maximum(par, 0)], par)
        trace, kind, start, dur = (
            trace[keep_rows],
            kind[keep_rows],
            start[keep_rows],
            dur[keep_rows],
        )
        req, resp, proto = req[keep_rows], resp[keep_rows], proto[keep_rows]
        svc, peer, par = svc[keep_rows], peer[keep_rows], par[keep_rows]
        span_ids = np.asarray(span_ids, dtype=object)[keep_rows]
    n = trace.size
    missing = par == -1
    if missing.any():
        report.notes[N_MISSING_PARENT] += int(missing.sum())
    par[par < 0] = -1
    idx = np.arange(n, dtype=np.int64)
    n_traces = len(trace_names)
    bad_trace = np.zeros(n_traces, dtype=bool)
    reason = np.full(n_traces, "", dtype=object)

    def drop(mask_rows: B, why: str) -> None:
        ts = np.unique(trace[mask_rows])
        new = ts[~bad_trace[ts]]
        bad_trace[new] = True
        reason[new] = why

    span_depth, cyclic = _depth(par)
    if cyclic.any():
        drop(cyclic, G_CYCLE)
        par[np.isin(trace, trace[cyclic])] = -1  # break them; the traces are dropped anyway

    internal = kind == INTERNAL
    cli = (kind == CLIENT) | (kind == PRODUCER)
    srv = (kind == SERVER) | (kind == CONSUMER)
    anc, nested, head, cand, partner, paired_srv = _answers(par, internal, cli, srv, svc, start)
    # one span id for both halves of an RPC (B3's shared spans; Jaeger's query gives the server
    # half a new id but not its children): the callee's own spans name the caller's client
    # span as their parent. They belong under the server that answers it, if of their service.
    p0 = np.maximum(par, 0)
    stray = idx[(par >= 0) & ~srv & cli[p0] & (svc[p0] != svc)]
    if stray.size:
        answer = partner[head[par[stray]]]
        mine = (answer >= 0) & (svc[np.maximum(answer, 0)] == svc[stray])
        # not a span that server hangs under (an internal span between client and server)
        mine[mine] = ~_between(par, internal, stray[mine], answer[mine])
        moved = stray[mine]
        if moved.size:
            par[moved] = answer[mine]
            span_depth, _ = _depth(par)
            report.notes[N_SHARED_ID] += int(moved.size)
            anc, nested, head, cand, partner, paired_srv = _answers(
                par, internal, cli, srv, svc, start
            )
    extra = cand & ~paired_srv
    if extra.any():
        report.notes[N_EXTRA_SERVER] += int(extra.sum())

    heads = cli & ~nested
    chain_peer = np.where(heads, peer, -1)
    nest_rows = idx[nested & (peer >= 0)]
    # the outermost nested peer wins (assignment order: deeper rows first)
    nest_rows = nest_rows[np.argsort(-span_depth[nest_rows], kind="stable")]
    chain_peer[head[nest_rows]] = np.where(
        chain_peer[head[nest_rows]] >= 0, chain_peer[head[nest_rows]], peer[nest_rows]
    )
    has_partner = partner >= 0
    answered = heads & (has_partner | (chain_peer >= 0))
    unanswered = heads & ~answered
    dead = unanswered | (nested & unanswered[head])
    if dead.any():
        report.dropped_rows[R_UNANSWERED] += int(dead.sum())
    own_srv = srv & ~paired_srv
    hop_heads = idx[answered]
    hop_srv = idx[own_srv]
    hrow = np.concatenate([hop_heads, hop_srv])  # the span that names the hop
    H = hrow.size
    is_cli_hop = np.zeros(H, dtype=bool)
    is_cli_hop[: hop_heads.size] = True
    prt = np.where(is_cli_hop, partner[hrow], -1)
    asyn = is_cli_hop & (prt >= 0) & (kind[np.maximum(prt, 0)] == CONSUMER)
    timing = np.where(asyn, prt, hrow)
    callee = np.where(
        is_cli_hop, np.where(prt >= 0, svc[np.maximum(prt, 0)], chain_peer[hrow]), svc[hrow]
    )
    caller = np.where(is_cli_hop, svc[hrow], -1)
    ex_rows = idx[extra]
    hop_of = np.full(n, -1, dtype=np.int64)
    hop_of[hrow] = np.arange(H)
    caller[hop_of[ex_rows]] = svc[anc[ex_rows]]  # a second server: called by the client's side

    # sizes and protocol: the partner's, else the head's, else the chain's nested clients'
    def chain_value(col: F64) -> F64:
        v = np.full(n, np.nan)
        v[hrow] = np.where(prt >= 0, col[np.maximum(prt, 0)], np.nan)
        v[hrow] = np.where(np.isnan(v[hrow]), col[hrow], v[hrow])
        nr = idx[nested & ~np.isnan(col)]
        fill = nr[np.isnan(v[head[nr]])]
        v[head[fill]] = col[fill]
        out: F64 = v[hrow]
        return out

    h_req = chain_value(req)
    h_resp = chain_value(resp)
    h_proto = np.maximum(proto[hrow], np.where(prt >= 0, proto[np.maximum(prt, 0)], 0))
    nr = idx[nested]
    nr = nr[hop_of[head[nr]] >= 0]
    np.maximum.at(h_proto, hop_of[head[nr]], proto[nr])
    # the call each span's work belongs to: a partner server (or consumer) opens its hop's
    # callee side, a server of its own its own hop; everything else inherits from its parent
    ctx_self = np.full(n, -1, dtype=np.int64)
    cp = prt >= 0
    ctx_self[prt[cp]] = np.arange(H)[cp]
    ctx_self[hop_srv] = hop_of[hop_srv]
    owner = _climb_up_or_self(par, ctx_self >= 0)
    ctx = np.where(owner >= 0, ctx_self[np.maximum(owner, 0)], -1)
    # a hop's parent: the context of the span above the hop's own span
    above = par[hrow]
    parent_hop = np.where(above >= 0, ctx[np.maximum(above, 0)], -1)
    parent_hop[asyn] = -1
    # callers follow the enclosing call's callee
    hp = parent_hop >= 0
    p_callee = callee[np.maximum(parent_hop, 0)]
    ext_under = hp & (caller < 0)
    if ext_under.any():
        report.notes[N_SERVER_UNDER] += int(ext_under.sum())
    differ = hp & (caller >= 0) & (caller != p_callee)
    if differ.any():
        report.notes[N_CALLER] += int(differ.sum())
    caller = np.where(hp, p_callee, caller)

    # service names → graph names (mapped), every hop must name its callee
    raw_names = cols.names
    mapped = [naming.rename(s) if s else "" for s in raw_names]
    gmap: dict[str, int] = {}
    code = np.array([gmap.setdefault(m, len(gmap)) if m else -1 for m in mapped] + [-1])
    g_callee = code[callee]
    g_caller = code[caller]
    h_trace = trace[hrow]
    nameless = (g_callee < 0) | ((caller >= 0) & (g_caller < 0))
    if nameless.any():
        drop_h = np.zeros(n, dtype=bool)
        drop_h[hrow[nameless]] = True
        drop(drop_h, G_NO_NAME)

    # times: clamp into the parent's interval, top-down
    h_start = start[timing].copy()
    h_end = h_start + dur[timing]
    depth, _ = _depth(parent_hop)
    was_clamped = np.zeros(H, dtype=bool)
    bound = (
        int(round(max_skew_us * 1000.0)) if math.isfinite(max_skew_us) else np.iinfo(np.int64).max
    )
    skewed = np.zeros(H, dtype=bool)
    for d in range(1, int(depth.max(initial=0)) + 1):
        at = np.flatnonzero(depth == d)
        lo, hi = h_start[parent_hop[at]], h_end[parent_hop[at]]
        out = np.maximum(np.maximum(lo - h_start[at], h_end[at] - hi), 0)
        skewed[at] = out > bound
        fix = at[(out > 0) & (out <= bound)]
        if fix.size:
            was_clamped[fix] = True
            plo, phi = h_start[parent_hop[fix]], h_end[parent_hop[fix]]
            s = np.minimum(np.maximum(h_start[fix], plo), phi)
            h_end[fix] = np.maximum(np.minimum(h_end[fix], phi), s)
            h_start[fix] = s
    if skewed.any():
        sk = np.zeros(n, dtype=bool)
        sk[hrow[skewed]] = True
        drop(sk, g_skew(max_skew_us))

    # keep the hops of good traces; order parents first within each trace
    has_hop = np.zeros(n_traces, dtype=bool)
    has_hop[h_trace] = True
    no_hop = ~has_hop & ~bad_trace
    bad_trace[no_hop] = True
    reason[no_hop] = G_NO_CALLS
    for why in np.unique(reason[bad_trace]).tolist():
        report.dropped_graphs[str(why)] += int((reason[bad_trace] == why).sum())
    row_dropped = bad_trace[trace]
    if row_dropped.any():
        report.dropped_rows[R_IN_DROPPED] += int((row_dropped & ~dead).sum())
    ok = ~bad_trace[h_trace]
    if (was_clamped & ok).any():
        report.notes[N_CLAMPED] += int((was_clamped & ok).sum())
    live = ~row_dropped
    if (internal & live).any():
        report.notes[N_INTERNAL] += int((internal & live).sum())
    if (nested & live & ~dead).any():
        report.notes[N_NESTED] += int((nested & live & ~dead).sum())
    report.rows_merged += int((paired_srv & live).sum() + (nested & live & ~dead).sum())
    keep = np.flatnonzero(ok)
    origin = np.full(n_traces, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(origin, h_trace[keep], h_start[keep])
    last = np.full(n_traces, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, h_trace[keep], h_end[keep])
    order = keep[np.lexsort((keep, h_start[keep], depth[keep], h_trace[keep]))]
    pos = np.full(H, -1, dtype=np.int64)
    pos[order] = np.arange(order.size)
    G_kept = np.flatnonzero(~bad_trace)
    report.graphs_kept += int(G_kept.size)
    report.rows_used += int(order.size)
    if (asyn[order]).any():
        report.notes[N_ASYNC] += int(asyn[order].sum())
    o_req, o_resp = h_req[order], h_resp[order]
    if np.isnan(o_req).any():
        report.notes[N_NO_REQ] += int(np.isnan(o_req).sum())
    if np.isnan(o_resp).any():
        report.notes[N_NO_RESP] += int(np.isnan(o_resp).sum())
    counts = np.bincount(h_trace[order], minlength=n_traces)[G_kept]
    graph_ptr = np.zeros(G_kept.size + 1, dtype=np.int64)
    np.cumsum(counts, out=graph_ptr[1:])
    o_parent = parent_hop[order]
    o_parent = np.where(o_parent >= 0, pos[np.maximum(o_parent, 0)], -1)
    o_trace = h_trace[order]
    t0 = origin[o_trace]
    services = tuple(gmap)
    specs: dict[SidecarSpec, int] = {}
    spec_of = np.full(len(services) + 1, -1, dtype=np.int64)
    for i, name in enumerate(services):
        sc = naming.sidecar(name)
        if sc.meshed:
            spec_of[i] = specs.setdefault(SidecarSpec(sc), len(specs))
    oc, oe = g_caller[order], g_callee[order]
    batch = EcgBatch(
        graph_ptr=graph_ptr,
        parent=o_parent,
        caller=oc,
        callee=oe,
        caller_spec=spec_of[oc],
        callee_spec=spec_of[oe],
        request_bytes=np.where(np.isnan(o_req), default_req, o_req),
        response_bytes=np.where(np.isnan(o_resp), default_resp, o_resp),
        rate=np.full(order.size, np.nan if rate is None else rate),
        start_us=(h_start[order] - t0) / 1000.0,
        duration_us=(h_end[order] - h_start[order]) / 1000.0,
        services=services,
        specs=tuple(specs),
        graph_names=tuple(trace_names[g] for g in G_kept.tolist()),
        row_ids=tuple([span_ids[i] for i in hrow[order].tolist()]),
        protocol=h_proto[order].astype(np.int64) if h_proto[order].any() else None,
    )
    return Paired(batch, origin[G_kept], last[G_kept], asyn[order])


def _between(par: I64, internal: B, rows: I64, servers: I64) -> B:
    """Whether each of ``rows`` is one of the internal spans between ``servers`` (same
    position) and the non-internal span above it."""
    hit = np.zeros(rows.size, dtype=bool)
    cur = par[servers]
    live = np.flatnonzero(cur >= 0)
    while live.size:
        c = cur[live]
        hit[live] |= c == rows[live]
        live = live[internal[c] & ~hit[live]]
        cur[live] = par[cur[live]]
        live = live[cur[live] >= 0]
    return hit


def _answers(
    par: I64, internal: B, cli: B, srv: B, svc: I64, start: I64
) -> tuple[I64, B, I64, B, I64, B]:
    """Who answers whom: every span's nearest non-internal proper ancestor (-1: none); client
    spans nested in a client span of their service (one call with it) and each client's chain
    head; servers under a client (candidates); each chain head's partner server (-1: none) —
    the earliest candidate, the others calls of their own — and the paired servers."""
    n = par.size
    idx = np.arange(n, dtype=np.int64)
    anc = np.where(par >= 0, _climb_up(par, ~internal), -1)
    has_anc = anc >= 0
    a0 = np.maximum(anc, 0)
    nested = cli & has_anc & cli[a0] & (svc[a0] == svc)
    head = _resolve(np.where(nested, anc, idx), nested)
    # servers answering a client chain: the earliest is its partner, others calls of their own
    cand = srv & has_anc & cli[a0]
    cand_rows = idx[cand]
    chain = head[anc[cand_rows]]
    order = np.lexsort((cand_rows, start[cand_rows], chain))
    chain_s = chain[order]
    first = np.ones(chain_s.size, dtype=bool)
    first[1:] = chain_s[1:] != chain_s[:-1]
    partner = np.full(n, -1, dtype=np.int64)
    partner[chain_s[first]] = cand_rows[order][first]
    paired_srv = np.zeros(n, dtype=bool)
    paired_srv[cand_rows[order][first]] = True
    return anc, nested, head, cand, partner, paired_srv


def _climb_up(par: I64, stop: B) -> I64:
    """For each row, its nearest proper ancestor where ``stop`` holds (-1: none)."""
    out = par.copy()
    for _ in range(64):
        m = out >= 0
        m[m] = ~stop[out[m]]
        if not m.any():
            return out
        out[m] = out[out[m]]
    raise RuntimeError("span tree deeper than 2^64")  # pragma: no cover - acyclic input


def _climb_up_or_self(par: I64, stop: B) -> I64:
    """For each row, the first row at or above it where ``stop`` holds (-1: none)."""
    nxt = np.where(stop, np.arange(par.size), par)  # stop rows point to themselves
    for _ in range(64):
        nxt2 = np.where(nxt >= 0, nxt[np.maximum(nxt, 0)], -1)
        if np.array_equal(nxt2, nxt):
            return nxt
        nxt = nxt2
    raise RuntimeError("span tree deeper than 2^64")  # pragma: no cover - acyclic input


def _resolve(ptr: I64, follow: B) -> I64:
    """Follow ``ptr`` from each row while the row reached has ``follow`` set."""
    out = ptr.copy()
    for _ in range(64):
        m = follow[out]
        if not m.any():
            return out
        out[m] = out[out[m]]
    raise RuntimeError("client chain deeper than 2^64")  # pragma: no cover


def empty() -> Paired:
    """No graphs."""
    z = np.zeros(0, dtype=np.int64)
    f = np.zeros(0, dtype=np.float64)
    return Paired(
        EcgBatch(
            graph_ptr=np.zeros(1, dtype=np.int64),
            parent=z,
            caller=z,
            callee=z,
            caller_spec=z,
            callee_spec=z,
            request_bytes=f,
            response_bytes=f,
            rate=f,
            start_us=f,
            duration_us=f,
            services=(),
            specs=(),
            graph_names=(),
        ),
        z,
        z,
        np.zeros(0, dtype=bool),
    )
