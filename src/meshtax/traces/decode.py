"""Typed, fast decoding of span documents into flat span rows (msgspec structs that name only
the fields meshtax uses; everything else in the JSON is skipped by the C decoder).

The OTLP and Zipkin decoders (:mod:`meshtax.traces.otlp`, :mod:`meshtax.traces.zipkin`)
append one tuple per span to a :class:`SpanRows` (see :data:`ROW` for the fields); Jaeger's
(:mod:`meshtax.traces.jaeger`) appends columns. :mod:`meshtax.traces.pairing` turns the
spans of whole traces into call graphs. This module holds what every format shares (rows,
the attribute scan, errors).
Times are integer nanoseconds since the epoch (Jaeger and Zipkin microseconds × 1000; OTLP
nanoseconds as given, never through a float). A malformed document raises
:class:`~meshtax.traces.errors.TraceFormatError` naming the file and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta, Raw, Struct

from meshtax.traces.errors import TraceFormatError

if TYPE_CHECKING:
    from meshtax.traces.jaeger import JaegerRows

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


#: resource attributes naming the node a service runs on, preferred first
NODE_KEYS = ("k8s.node.name", "host.name")


class SpanRows:
    """Span rows of one or more documents: ``rows`` to be joined on ids (and ``complete``:
    whether every trace in them is whole — Zipkin's lists of traces are, OTLP batches are
    not), ``jaeger``: columns of whole Jaeger traces, joined per trace while decoding
    (:mod:`meshtax.traces.jaeger`)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.complete = True
        self.jaeger: JaegerRows | None = None
        self.nodes: dict[str, str] = {}  # service name → the node its resource names

    def note_node(self, service: str, attrs: Iterable[tuple[str, object]]) -> None:
        """The node of ``service`` from its resource's (or process's) attributes:
        ``k8s.node.name``, else ``host.name``; the first seen per service is kept."""
        found = {k: v for k, v in attrs if k in NODE_KEYS and v}
        node = next((found[k] for k in NODE_KEYS if k in found), None)
        if service and node is not None:
            self.nodes.setdefault(service, str(node)[:253])

    def __len__(self) -> int:
        return len(self.rows) + (len(self.jaeger) if self.jaeger is not None else 0)


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


def _decode(
    data: bytes, typ: Any, where: str, decoder: msgspec.json.Decoder[Any] | None = None
) -> Any:
    """``data`` decoded as ``typ`` (by ``decoder``, made for ``typ``, when given: saves the
    type's lookup per call)."""
    try:
        return msgspec.json.decode(data, type=typ) if decoder is None else decoder.decode(data)
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
