"""Typed, fast decoding of span documents into flat span rows (msgspec structs that name only
the fields meshtax uses; everything else in the JSON is skipped by the C decoder).

Each decoder appends one tuple per span to a :class:`SpanRows` (see :data:`ROW` for the
fields); :mod:`meshtax.traces.pairing` turns the rows of whole traces into call graphs.
This module holds what every format shares (rows, the attribute scan, errors) and Jaeger;
OTLP and Zipkin are :mod:`meshtax.traces.otlp` and :mod:`meshtax.traces.zipkin`.
Times are integer nanoseconds since the epoch (Jaeger and Zipkin microseconds × 1000; OTLP
nanoseconds as given, never through a float). A malformed document raises
:class:`~meshtax.traces.alibaba.TraceFormatError` naming the file and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Raw, Struct

from meshtax.traces.alibaba import TraceFormatError

# span kinds (codes of the kind column)
INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER = 0, 1, 2, 3, 4
KIND_CODES = {
    "internal": INTERNAL,
    "server": SERVER,
    "client": CLIENT,
    "producer": PRODUCER,
    "consumer": CONSUMER,
}
# protocol codes: indices into meshtax.model.ecg.PROTOCOLS ("", "http", "grpc")
HTTP, GRPC = 1, 2

#: Request size attributes, most specific first (current semantic conventions, then older
#: names); a span's first readable one wins over its message events.
REQ_SIZE_KEYS = (
    "http.request.body.size",
    "http.request_content_length",
    "http.request.header.content-length",
    "rpc.request.size",
    "rpc.message.uncompressed_size",
    "messaging.message.body.size",
    "messaging.message_payload_size_bytes",
)
RESP_SIZE_KEYS = (
    "http.response.body.size",
    "http.response_content_length",
    "http.response.header.content-length",
    "rpc.response.size",
)
#: Where a client span names its callee when no server span answers it.
PEER_KEYS = ("peer.service", "server.address", "net.peer.name", "rpc.service", "db.system")
#: Message-event attributes (gRPC ``message`` events: type SENT/RECEIVED, uncompressed size).
EVENT_TYPE_KEYS = ("rpc.message.type", "message.type")
EVENT_SIZE_KEYS = ("rpc.message.uncompressed_size", "message.uncompressed_size")

_REQ, _RESP, _PEER, _KIND, _RPCSYS = 0, 1, 2, 3, 4
_SLOT: dict[str, tuple[int, int]] = {
    **{k: (_REQ, r) for r, k in enumerate(REQ_SIZE_KEYS)},
    **{k: (_RESP, r) for r, k in enumerate(RESP_SIZE_KEYS)},
    **{k: (_PEER, r) for r, k in enumerate(PEER_KEYS)},
    "span.kind": (_KIND, 0),
    "rpc.system": (_RPCSYS, 0),
}
NAN = math.nan
MAX_US = 4_000_000_000_000_000  # µs: start + duration in ns stays inside int64
MAX_NS = MAX_US * 1000
Micros = Annotated[int, Meta(ge=0, le=MAX_US)]

#: One span row: (trace id, span id, parent span id or "", service name, kind code,
#: start ns, duration ns, request bytes or NaN, response bytes or NaN, peer name or "",
#: protocol code)
ROW = (
    "trace",
    "span",
    "parent",
    "service",
    "kind",
    "start_ns",
    "dur_ns",
    "req",
    "resp",
    "peer",
    "proto",
)
Row = tuple[str, str, str, str, int, int, int, float, float, str, int]


class Resolved:
    """Rows of whole traces whose parents the decoder joined itself (one trace object at a
    time): (trace index, span id, parent row or -1 missing / -2 none, service code, kind
    (-1: a duplicate span id), start ns, duration ns, request, response, peer code,
    protocol). Codes index :attr:`names` from 0 (``""`` is -1)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, int, int, int, int, int, float, float, int, int]] = []
        self.trace_names: list[str] = []
        self.names: dict[str, int] = {"": -1}


class SpanRows:
    """Span rows of one or more documents: ``rows`` to be joined on ids (and ``complete``:
    whether every trace in them is whole — Zipkin's lists of traces are, OTLP batches are
    not), ``resolved`` of whole traces joined while decoding (Jaeger)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.complete = True
        self.resolved = Resolved()

    def __len__(self) -> int:
        return len(self.rows) + len(self.resolved.rows)


# ---- attribute values ---------------------------------------------------------------------


def _size(v: Any) -> float:
    """A size attribute's value in bytes, NaN when it is not a finite number ≥ 0."""
    if v.__class__ is int:
        return float(v) if 0 <= v < 10**18 else NAN
    if isinstance(v, list):  # header attributes are string arrays
        v = v[0] if v else None
    if isinstance(v, bool) or v is None:
        return NAN
    if not isinstance(v, (int, float)):
        try:
            v = float(v)
        except (TypeError, ValueError):
            return NAN
    f = float(v)
    return f if 0.0 <= f < 1e18 else NAN


class _Attrs:
    """What one span's attributes say: sizes, peer, protocol, kind (Jaeger/Zipkin tags)."""

    __slots__ = ("req", "resp", "rq", "rs", "peer", "pr", "proto", "kind", "ev_req", "ev_resp")

    def __init__(self) -> None:
        self.req = NAN
        self.resp = NAN
        self.rq = 99
        self.rs = 99
        self.peer = ""
        self.pr = 99
        self.proto = 0
        self.kind: str | None = None
        self.ev_req = NAN  # sums of message events
        self.ev_resp = NAN

    def add(self, k: str, v: Any) -> None:
        if self.proto == 0 and k.startswith("http."):
            self.proto = HTTP
        slot = _SLOT.get(k)
        if slot is None:
            return
        what, rank = slot
        if what == _REQ:
            if rank < self.rq:
                f = _size(v)
                if f == f:
                    self.req, self.rq = f, rank
        elif what == _RESP:
            if rank < self.rs:
                f = _size(v)
                if f == f:
                    self.resp, self.rs = f, rank
        elif what == _PEER:
            if rank < self.pr and isinstance(v, str) and v.strip():
                self.peer, self.pr = v, rank
        elif what == _KIND:
            self.kind = str(v).lower()
        elif isinstance(v, str) and v.lower() == "grpc":
            self.proto = GRPC

    def event(self, items: Iterable[tuple[str, Any]], kind: int) -> None:
        """A message event: SENT/RECEIVED size, counted as request or response by the side
        (a client sends the request; a server receives it)."""
        typ = ""
        size = NAN
        for k, v in items:
            if k in EVENT_TYPE_KEYS and isinstance(v, str):
                typ = v.upper()
            elif k in EVENT_SIZE_KEYS:
                size = _size(v)
        if size != size or typ not in ("SENT", "RECEIVED"):
            return
        sends_request = kind in (CLIENT, PRODUCER)
        if (typ == "SENT") == sends_request:
            self.ev_req = size if self.ev_req != self.ev_req else self.ev_req + size
        else:
            self.ev_resp = size if self.ev_resp != self.ev_resp else self.ev_resp + size

    def sizes(self) -> tuple[float, float]:
        return (
            self.req if self.rq < 99 else self.ev_req,
            self.resp if self.rs < 99 else self.ev_resp,
        )


def _scan(items: Iterable[Any], otlp: bool) -> tuple[Any, float, float, str, int, bool, bool]:
    """What a span's tags (Jaeger ``.key``/``.value``) or attributes (OTLP key-values) say:
    (``span.kind`` tag, request bytes, response bytes, peer, protocol, whether the request
    and the response size were given). The hot loop of decoding: a key that is none of ours
    costs one dictionary miss."""
    kind: Any = None
    http = grpc = False
    req = resp = NAN
    rq = rs = pr = 99
    peer = ""
    slots = _SLOT
    for it in items:
        k = it.key
        if not http and k.startswith("http."):
            http = True
        slot = slots.get(k)
        if slot is None:
            continue
        what, rank = slot
        v = _otlp_value(it.value) if otlp else it.value
        if what == _PEER:
            if rank < pr and v.__class__ is str and v.strip():
                peer, pr = v, rank
        elif what == _REQ:
            if rank < rq:
                f = _size(v)
                if f == f:
                    req, rq = f, rank
        elif what == _RESP:
            if rank < rs:
                f = _size(v)
                if f == f:
                    resp, rs = f, rank
        elif what == _KIND:
            kind = v
        elif v.__class__ is str and v.lower() == "grpc":
            grpc = True
    return kind, req, resp, peer, GRPC if grpc else HTTP if http else 0, rq < 99, rs < 99


def _events(events: Iterable[Any], kind: int, otlp: bool) -> tuple[float, float]:
    """Request and response bytes summed over message events (NaN: none)."""
    a = _Attrs()
    for ev in events:
        items = ev.attributes if otlp else ev.fields
        a.event(((kv.key, _otlp_value(kv.value) if otlp else kv.value) for kv in items), kind)
    return a.ev_req, a.ev_resp


def _kind_code(name: str | None, where: str) -> int:
    if name is None or name == "":
        return INTERNAL
    code = KIND_CODES.get(name.lower().removeprefix("span_kind_"))
    if code is None:
        if name.upper() in ("SPAN_KIND_UNSPECIFIED", "UNSPECIFIED"):
            return INTERNAL
        raise TraceFormatError(f"{where}: span kind {name!r} is not one of {', '.join(KIND_CODES)}")
    return code


def _decode(data: bytes, typ: Any, where: str) -> Any:
    try:
        return msgspec.json.decode(data, type=typ)
    except msgspec.ValidationError as e:
        raise TraceFormatError(f"{where}: {_path(str(e))}") from None
    except msgspec.DecodeError as e:
        raise TraceFormatError(f"{where}: invalid JSON ({e}; truncated file?)") from None
    except RecursionError:
        raise TraceFormatError(f"{where}: JSON nested too deeply") from None
    except UnicodeDecodeError as e:  # msgspec lets invalid UTF-8 in a string through as this
        raise TraceFormatError(
            f"{where}: not UTF-8 text at byte {e.start} (binary data?)"
        ) from None


def _path(msg: str) -> str:
    """msgspec's '… - at `$.data[0].x`' as 'data[0].x: …'."""
    text, sep, at = msg.rpartition(" - at `")
    if not sep:
        return msg
    return f"{at.rstrip('`').removeprefix('$').lstrip('.') or 'document'}: {text}"


# ---- OTLP attribute values (shared: the attribute scan reads them) ---------------------


class _Any(Struct, gc=False):
    stringValue: str | None = None
    intValue: int | str | None = None
    doubleValue: float | str | None = None
    boolValue: bool | None = None
    arrayValue: Raw | None = None
    kvlistValue: Raw | None = None
    bytesValue: str | None = None


class _KV(Struct, gc=False):
    key: str
    value: _Any | None = None


def _otlp_value(v: _Any | None) -> Any:
    if v is None:
        return None
    if v.stringValue is not None:
        return v.stringValue
    if v.intValue is not None:
        return v.intValue
    if v.doubleValue is not None:
        return v.doubleValue
    if v.boolValue is not None:
        return v.boolValue
    return None


# ---- Jaeger (query API JSON) ----------------------------------------------------------------


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


class _JDocTraces(Struct, gc=False):
    data: list[_JTrace]


def read_jaeger_doc(doc: bytes, where: str, out: SpanRows) -> bool:
    """Append the spans of a whole Jaeger document in one decoding pass (``{"data": [...]}``,
    a list of traces, or one trace); False when it is none of these."""
    s = doc.lstrip()[:1]
    traces: list[_JTrace]
    if s == b"[":
        traces = _decode(doc, list[_JTrace], where)
    elif b'"data"' in doc:
        traces = _decode(doc, _JDocTraces, where).data
    elif b'"spans"' in doc:
        traces = [_decode(doc, _JTrace, where)]
    else:
        return False
    for i, t in enumerate(traces):
        _add_jaeger(t, f"{where}: data[{i}]", out)
    return True


def read_jaeger_trace(raw: bytes, where: str, out: SpanRows) -> None:
    """Append the spans of one Jaeger trace object (parents joined within the trace)."""
    _add_jaeger(_decode(raw, _JTrace, where), where, out)


def _add_jaeger(t: _JTrace, where: str, out: SpanRows) -> None:
    res = out.resolved
    names = res.names
    procs = {k: names.setdefault(p.serviceName, len(names) - 1) for k, p in t.processes.items()}
    spans = t.spans
    ti = len(res.trace_names)
    res.trace_names.append(t.traceID or (spans[0].traceID if spans else ""))
    base = len(res.rows)
    local = {s.spanID: base + i for i, s in enumerate(spans)}
    dups = len(local) != len(spans)
    rows = res.rows
    codes = KIND_CODES
    for si, s in enumerate(spans):
        kind_s, req, resp, peer, proto, has_req, has_resp = _scan(s.tags, False)
        if kind_s is None:
            kind = INTERNAL
        else:
            kind = codes.get(kind_s, -1) if kind_s.__class__ is str else -1
            if kind < 0:
                kind = _kind_code(str(kind_s), f"{where}.spans[{si}].tags.span.kind")
        if s.logs and not (has_req and has_resp):
            ev_req, ev_resp = _events(s.logs, kind, False)
            req = req if has_req else ev_req
            resp = resp if has_resp else ev_resp
        parent = -2
        for r in s.references:
            if r.refType in ("CHILD_OF", "FOLLOWS_FROM"):
                parent = local.get(r.spanID, -1)
                break
        if s.process is None:
            svc = procs.get(s.processID, -1)
        else:
            svc = names.setdefault(s.process.serviceName, len(names) - 1)
        if dups and local[s.spanID] != base + si:
            kind = -1  # a duplicate id: the last span with it is kept
        rows.append(
            (
                ti,
                s.spanID,
                parent,
                svc,
                kind,
                s.startTime * 1000,
                s.duration * 1000,
                req,
                resp,
                names.setdefault(peer, len(names) - 1) if peer else -1,
                proto,
            )
        )
