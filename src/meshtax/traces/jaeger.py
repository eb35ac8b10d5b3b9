"""Jaeger query-API JSON → span columns.

A document is decoded by msgspec structs naming only the fields read. Its traces are taken
apart while their objects are in the cache, a trace object at a time, by list
comprehensions: one over the spans (start, duration, parent joined within the trace,
service) and one over all their tags, keeping the tags that matter as (row, key code,
value). Every :data:`CHUNK_SPANS` spans these become NumPy columns, and what the tags say is
worked out over all of them at once — the rule of :func:`meshtax.traces.decode._scan`: a
slot's most specific readable key wins, the last ``span.kind`` tag wins, ``http.*`` keys
mean HTTP and ``rpc.system=grpc`` gRPC, sizes come from message events (Jaeger logs) only
when no attribute gives them. Parents are joined per trace object (span ids are unique
within a trace, not across).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import Raw, Struct

from meshtax.traces.decode import (
    CLIENT,
    GRPC,
    HTTP,
    INTERNAL,
    KIND_CODES,
    NAN,
    NODE_KEYS,
    PEER_KEYS,
    PRODUCER,
    REQ_SIZE_KEYS,
    RESP_SIZE_KEYS,
    Micros,
    SpanRows,
    _Attrs,
    _decode,
    _kind_code,
    _size,
)
from meshtax.traces.errors import TraceFormatError

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class _JTag(Struct, gc=False):
    key: str
    value: str | int | float | bool | None = None


class _JRef(Struct, gc=False):
    spanID: str
    refType: str = "CHILD_OF"


class _JLog(Struct, gc=False):
    fields: list[_JTag] = []


class _JProc(Struct, gc=False):
    serviceName: str = ""
    tags: list[_JTag] = []


class _JSpan(Struct, gc=False):
    spanID: str
    startTime: Micros
    duration: Micros = 0
    traceID: str = ""
    references: list[_JRef] = []
    tags: list[_JTag] = []
    logs: list[_JLog] = []
    processID: str = ""
    process: _JProc | None = None


class _JTrace(Struct, gc=False):
    spans: list[_JSpan]
    traceID: str = ""
    processes: dict[str, _JProc] = {}


class _JDoc(Struct, gc=False):
    data: list[Raw]


class _JDocTraces(Struct, gc=False):
    data: list[_JTrace]


# ---- tag keys → codes ------------------------------------------------------------------------
# A tag key's code: bit 0 says the key starts with "http." (the span speaks HTTP); the bits
# above name the slot it fills (0: none of ours) as what × 16 + rank (rank 0 most specific).
_REQ, _RESP, _PEER, _KIND, _RPCSYS = 1, 2, 3, 4, 5


def _key_code(key: str) -> int:
    """A tag key's code (see above)."""
    slot = 0
    for what, keys in ((_REQ, REQ_SIZE_KEYS), (_RESP, RESP_SIZE_KEYS), (_PEER, PEER_KEYS)):
        if key in keys:
            slot = what * 16 + keys.index(key)
    if key == "span.kind":
        slot = _KIND * 16
    elif key == "rpc.system":
        slot = _RPCSYS * 16
    return slot << 1 | key.startswith("http.")


_CODES: dict[str, int] = {}  # every key met so far (bounded: a hostile input's are not kept)
_MAX_CODES = 1 << 16
_REF_OK = frozenset(("CHILD_OF", "FOLLOWS_FROM"))
_NODE_KEYS = frozenset(NODE_KEYS)


def _code(key: str) -> int:
    code = _CODES.get(key)
    if code is None:
        code = _key_code(key)
        if len(_CODES) < _MAX_CODES:
            _CODES[key] = code
    return code


#: spans taken to columns at a time, while their rows are still in the cache (a task's
#: 20 000 at its end cost ~0.8 µs a span more: the rows had left the cache)
CHUNK_SPANS = 1024


class JaegerRows:
    """Spans of whole Jaeger traces (a task's worth), parents joined per trace. Per span
    :attr:`rows` holds (start µs, duration µs, parent row — -1 for a parent not in the trace,
    -2 for none —, service code); per tag that fills a slot or says HTTP, :attr:`tags` holds
    (row, key code, value). Every :data:`CHUNK_SPANS` spans they are taken to columns.
    Names (services, peers) are codes into :attr:`names` (``""`` is -1); :meth:`columns`
    puts them in the order a span-by-span reader meets them."""

    def __init__(self) -> None:
        self.trace_names: list[str] = []
        self.trace_where: list[str] = []
        self.trace_base: list[int] = []  # first row of each trace
        self.names: dict[str, int] = {"": -1}
        self._name_at: list[tuple[int, int, int]] = []  # (trace, phase, row): first met
        self.span_ids: list[str] = []
        self.rows: list[tuple[int, int, int, int]] = []  # rows from ``first`` on
        self.tags: list[tuple[int, int, Any]] = []
        self.events: dict[int, tuple[float, float]] = {}  # row → (SENT, RECEIVED) bytes
        self.first = 0  # the first row not yet in columns
        self.duplicate: list[int] = []  # rows whose span id came again later in the trace
        self._done: list[dict[str, Any]] = []  # columns of earlier chunks

    def __len__(self) -> int:
        return len(self.span_ids)

    def _name(self, name: str, at: tuple[int, int, int]) -> int:
        """The code of ``name``, met at ``at`` (trace, phase, row); the first meeting is kept
        (a chunk's peers are read after its traces: one may come before a service)."""
        code = self.names.get(name)
        if code is None:
            code = self.names[name] = len(self.names) - 1
            self._name_at.append(at)
        elif code >= 0 and at < self._name_at[code]:
            self._name_at[code] = at
        return code

    def add(self, t: _JTrace, where: str, nodes: SpanRows) -> None:
        """Append one trace object (services' nodes noted in ``nodes``)."""
        spans = t.spans
        ti = len(self.trace_names)
        base = len(self.span_ids)
        self.trace_names.append(t.traceID or (spans[0].traceID if spans else ""))
        self.trace_where.append(where)
        self.trace_base.append(base)
        pget = self._processes(t, ti, nodes).get
        ids = [s.spanID for s in spans]
        self.span_ids += ids
        local = dict(zip(ids, range(base, base + len(ids)), strict=True))
        if len(local) != len(ids):  # a duplicate id: the last span with it is kept
            self.duplicate += (r for r, i in enumerate(ids, base) if local[i] != r)
        get = local.get
        self.rows += [
            (
                s.startTime,
                s.duration,
                (get(refs[0].spanID, -1) if refs[0].refType in _REF_OK else _parent(refs, local))
                if (refs := s.references)
                else -2,
                pget(s.processID, -1),
            )
            for s in spans
        ]
        try:  # every key met before (the common case): one pass, no call per tag
            codes = _CODES
            self.tags += [
                (r, c, g.value)
                for r, s in enumerate(spans, base)
                for g in s.tags
                if (c := codes[g.key])
            ]
        except KeyError:
            self.tags += [
                (r, c, g.value)
                for r, s in enumerate(spans, base)
                for g in s.tags
                if (c := _code(g.key))
            ]
        if any([s.logs or s.process for s in spans]):
            self._rare(spans, base, ti, nodes)
        if len(self.span_ids) - self.first >= CHUNK_SPANS:
            self._take()

    def _processes(self, t: _JTrace, ti: int, nodes: SpanRows) -> dict[str, int]:
        """Process id → service code; nodes noted from the processes' tags."""
        procs = t.processes
        services = [p.serviceName for p in procs.values()]
        got = list(map(self.names.get, services))
        codes = [self._name(s, (ti, 0, 0)) if c is None else c for s, c in zip(services, got)]
        for q in [p for p in procs.values() for g in p.tags if g.key in _NODE_KEYS]:
            nodes.note_node(q.serviceName, ((g.key, g.value) for g in q.tags))
        return dict(zip(procs, codes, strict=True))

    def _rare(self, spans: Sequence[_JSpan], base: int, ti: int, nodes: SpanRows) -> None:
        """Message events (Jaeger logs) and processes given inline in the span."""
        for r, s in enumerate(spans, base):
            if s.logs:
                self.events[r] = _message_events(s.logs)
            if s.process is not None:
                name = s.process.serviceName
                row = self.rows[r - self.first]
                code = self._name(name, (ti, 1, 2 * r))
                self.rows[r - self.first] = (row[0], row[1], row[2], code)
                nodes.note_node(name, ((g.key, g.value) for g in s.process.tags))

    def _take(self) -> None:
        """The rows and tags since :attr:`first` to columns (kind, sizes, peer, protocol)."""
        n = len(self.span_ids) - self.first
        if n == 0:
            return
        first = self.first
        start, dur, parent, svc = (
            np.array(c, dtype=np.int64) for c in zip(*self.rows, strict=True)
        )
        tag_row, tag_code, tag_values = zip(*self.tags, strict=True) if self.tags else ((), (), ())
        tag_rows = np.array(tag_row, dtype=np.int64) - first
        codes = np.array(tag_code, dtype=np.int64)
        http = np.zeros(n, dtype=bool)
        http[tag_rows[(codes & 1) == 1]] = True
        ours = np.flatnonzero(codes > 1)
        rows, slot = tag_rows[ours], codes[ours] >> 1
        values = np.fromiter([tag_values[i] for i in ours.tolist()], dtype=object, count=ours.size)
        what, rank = slot >> 4, slot & 15
        kind = self._kinds(n, rows, what, values)
        req, has_req = _sizes(n, rows, what == _REQ, rank, values)
        resp, has_resp = _sizes(n, rows, what == _RESP, rank, values)
        if self.events:
            ev = np.array(list(self.events), dtype=np.int64) - first
            sent, received = np.array(list(self.events.values()), dtype=np.float64).T
            sends = (kind[ev] == CLIENT) | (kind[ev] == PRODUCER)  # a client sends the request
            req[ev] = np.where(has_req[ev], req[ev], np.where(sends, sent, received))
            resp[ev] = np.where(has_resp[ev], resp[ev], np.where(sends, received, sent))
        peer = self._peers(n, rows, what == _PEER, rank, values)
        m = what == _RPCSYS
        is_grpc = [v.__class__ is str and v.lower() == "grpc" for v in values[m]]
        grpc = np.zeros(n, dtype=bool)
        grpc[rows[m][np.array(is_grpc, dtype=bool)]] = True
        self._done.append(
            {
                "parent": parent,
                "service": svc,
                "peer": peer,
                "kind": kind,
                "start": start * 1000,
                "dur": dur * 1000,
                "req": req,
                "resp": resp,
                "proto": np.where(grpc, GRPC, np.where(http, HTTP, 0)).astype(np.int8),
            }
        )
        self.rows, self.tags, self.events = [], [], {}
        self.first += n

    def _trace_of(self, row: int) -> int:
        return bisect_right(self.trace_base, row) - 1

    def columns(self) -> dict[str, Any]:
        """The task's spans as NumPy columns (the fields of
        :class:`~meshtax.traces.pairing.SpanColumns`)."""
        self._take()
        n = len(self.span_ids)
        done = self._done
        cols = {k: np.concatenate([c[k] for c in done]) for k in done[0]} if done else {}
        order = self._name_order()
        if order is not None:
            cols["service"], cols["peer"] = order[cols["service"]], order[cols["peer"]]
        dup = None
        if self.duplicate:
            dup = np.zeros(n, dtype=bool)
            dup[self.duplicate] = True
        bases = np.append(self.trace_base, n)
        return {
            **cols,
            "trace": np.repeat(np.arange(len(self.trace_names)), np.diff(bases)),
            "trace_names": self.trace_names,
            "span_ids": self.span_ids,
            "names": list(self.names)[1:] if order is None else self._ordered_names(order),
            "duplicate": dup,
        }

    def _kinds(
        self, n: int, rows: I64, what: I64, values: npt.NDArray[np.object_]
    ) -> npt.NDArray[np.int8]:
        """Each span's kind: its last ``span.kind`` tag's (none, or null: internal)."""
        m = np.flatnonzero(what == _KIND)
        last = np.ones(m.size, dtype=bool)
        last[:-1] = rows[m][1:] != rows[m][:-1]
        m = m[last]
        got = np.fromiter(
            map(KIND_CODES.get, values[m].tolist(), repeat(-1)), dtype=np.int8, count=m.size
        )
        for j in np.flatnonzero(got < 0).tolist():  # not a lower-case name: the long way
            v, r = values[m[j]], int(rows[m[j]]) + self.first
            if v is None:
                got[j] = INTERNAL
            else:
                ti = self._trace_of(r)
                si = r - self.trace_base[ti]
                got[j] = _kind_code(str(v), f"{self.trace_where[ti]}.spans[{si}].tags.span.kind")
        kind = np.full(n, INTERNAL, dtype=np.int8)
        kind[rows[m]] = got
        return kind

    def _peers(
        self,
        n: int,
        rows: I64,
        mask: npt.NDArray[np.bool_],
        rank: I64,
        values: npt.NDArray[np.object_],
    ) -> I64:
        """Each span's peer name code: its most specific non-blank peer attribute's."""
        m = np.flatnonzero(mask)
        # per distinct value (values are JSON scalars: hashable; 1 and True meet, neither a name)
        vals = values[m].tolist()
        named = {v: v.__class__ is str and bool(v.strip()) for v in dict.fromkeys(vals)}
        m = m[np.fromiter(map(named.__getitem__, vals), dtype=bool, count=m.size)]
        m = m[_first_by_rank(rows[m], rank[m])]
        peer = np.full(n, -1, dtype=np.int64)
        if m.size:
            vals, at = values[m].tolist(), (rows[m] + self.first).tolist()
            firsts = dict(zip(reversed(vals), reversed(at), strict=True))  # value → first row
            code = {
                v: self._name(v, (self._trace_of(r), 1, 2 * r + 1))
                for v, r in reversed(firsts.items())
            }
            peer[rows[m]] = np.fromiter(map(code.__getitem__, vals), np.int64, m.size)
        return peer

    def _name_order(self) -> I64 | None:
        """Codes → codes in the order a span-by-span reader meets the names (None: the same)."""
        at = self._name_at
        if all(at[i] <= at[i + 1] for i in range(len(at) - 1)):
            return None
        order = sorted(range(len(at)), key=at.__getitem__)  # stable: ties keep their order
        new = np.empty(len(at) + 1, dtype=np.int64)
        new[np.array(order, dtype=np.int64)] = np.arange(len(at))
        new[-1] = -1  # code -1 ("") stays
        return new

    def _ordered_names(self, order: I64) -> list[str]:
        names = list(self.names)[1:]
        out = [""] * len(names)
        for i, name in enumerate(names):
            out[order[i]] = name
        return out


def _parent(refs: list[_JRef], local: dict[str, int]) -> int:
    """The row of the first CHILD_OF/FOLLOWS_FROM reference (-2: none)."""
    for r in refs:
        if r.refType in _REF_OK:
            return local.get(r.spanID, -1)
    return -2


def _message_events(logs: list[_JLog]) -> tuple[float, float]:
    """Bytes of the SENT and of the RECEIVED message events of a span's logs (NaN: none)."""
    a = _Attrs()
    for log in logs:
        a.event(((f.key, f.value) for f in log.fields), CLIENT)  # a client: SENT is the request
    return a.ev_req, a.ev_resp


def _first_by_rank(rows: I64, rank: I64) -> I64:
    """Positions of the most specific (lowest rank, then first) tag of each row, of tags in
    row order."""
    if rows.size == 0:
        return rows
    o = np.lexsort((rank, rows))  # stable: of equal ranks the first wins
    first = np.ones(o.size, dtype=bool)
    first[1:] = rows[o][1:] != rows[o][:-1]
    return o[first]


def _sizes(
    n: int, rows: I64, mask: npt.NDArray[np.bool_], rank: I64, values: npt.NDArray[np.object_]
) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Each span's size from its most specific readable size tag (NaN: none), and whether
    one was given."""
    out = np.full(n, NAN)
    given = np.zeros(n, dtype=bool)
    m = np.flatnonzero(mask)
    if m.size:
        f = _size_values(values[m])
        ok = ~np.isnan(f)
        m, f = m[ok], f[ok]
        at = _first_by_rank(rows[m], rank[m])
        out[rows[m[at]]] = f[at]
        given[rows[m[at]]] = True
    return out, given


def _size_values(v: npt.NDArray[np.object_]) -> F64:
    """:func:`meshtax.traces.decode._size` of each value; integers in one NumPy pass."""
    if v.size and set(map(type, v)) == {int}:
        try:
            i = v.astype(np.int64)
        except OverflowError:
            pass
        else:
            return np.where((i >= 0) & (i < 10**18), i.astype(np.float64), NAN)
    return np.fromiter(map(_size, v), dtype=np.float64, count=v.size)


# ---- documents -------------------------------------------------------------------------------


def jaeger_traces(doc: bytes, where: str) -> list[Raw] | None:
    """The raw traces of a Jaeger document: ``{"data": [trace, ...]}``, a list of traces, or
    one trace object; None when the document is none of these."""
    s = doc.lstrip()
    if s[:1] == b"[":
        return _decode(doc, list[Raw], where)  # type: ignore[no-any-return]
    if b'"data"' in doc[:4096] or b'"data"' in doc:
        try:
            return _decode(doc, _JDoc, where).data  # type: ignore[no-any-return]
        except TraceFormatError:
            if b'"spans"' not in doc[:4096]:
                raise
    if b'"spans"' in doc:
        return [Raw(doc)]
    return None


def read_jaeger_doc(doc: bytes, where: str, out: SpanRows) -> bool:
    """Append the spans of a whole Jaeger document in one decoding pass (``{"data": [...]}``,
    a list of traces, or one trace); False when it is none of these."""
    traces: list[_JTrace]
    if _first_char(doc) == b"[":
        traces = _decode(doc, list[_JTrace], where, _LIST)
    elif b'"data"' in doc:
        traces = _decode(doc, _JDocTraces, where, _DOC).data
    elif b'"spans"' in doc:
        traces = [_decode(doc, _JTrace, where, _TRACE)]
    else:
        return False
    rows = _rows(out)
    for i, t in enumerate(traces):
        rows.add(t, f"{where}: data[{i}]", out)
    return True


def read_jaeger_trace(raw: bytes, where: str, out: SpanRows) -> None:
    """Append the spans of one Jaeger trace object (parents joined within the trace)."""
    _rows(out).add(_decode(raw, _JTrace, where, _TRACE), where, out)


_LIST = msgspec.json.Decoder(list[_JTrace])
_DOC = msgspec.json.Decoder(_JDocTraces)
_TRACE = msgspec.json.Decoder(_JTrace)
_TEXT = re.compile(rb"\S")


def _first_char(doc: bytes) -> bytes:
    m = _TEXT.search(doc)
    return m.group() if m else b""


def _rows(out: SpanRows) -> JaegerRows:
    if out.jaeger is None:
        out.jaeger = JaegerRows()
    return out.jaeger
