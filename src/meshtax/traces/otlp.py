"""OTLP span documents: JSON (``TracesData``/``ExportTraceServiceRequest``, one document or
JSON Lines; Jaeger's API v3 wraps it in ``result``) and protobuf, into span rows (see
:mod:`meshtax.traces.decode`)."""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from meshtax.traces.decode import (
    _KV,
    CLIENT,
    CONSUMER,
    INTERNAL,
    MAX_NS,
    PRODUCER,
    SERVER,
    SpanRows,
    _Attrs,
    _decode,
    _events,
    _kind_code,
    _otlp_value,
    _scan,
)
from meshtax.traces.errors import TraceFormatError


class _OEvent(Struct, gc=False):
    name: str = ""
    attributes: list[_KV] = []


class _OSpan(Struct, gc=False):
    traceId: str
    spanId: str
    startTimeUnixNano: int | str
    endTimeUnixNano: int | str
    parentSpanId: str = ""
    kind: int | str = 0
    attributes: list[_KV] = []
    events: list[_OEvent] = []


class _OScope(Struct, gc=False):
    spans: list[_OSpan] = []


class _OResource(Struct, gc=False):
    attributes: list[_KV] = []


class _OResourceSpans(Struct, gc=False):
    resource: _OResource | None = None
    scopeSpans: list[_OScope] = []
    instrumentationLibrarySpans: list[_OScope] = []


class _OResult(Struct, gc=False):
    resourceSpans: list[_OResourceSpans] = []


class _ODoc(Struct, gc=False):
    resourceSpans: list[_OResourceSpans] | None = None
    result: _OResult | None = None  # Jaeger's query API v3 wraps OTLP in "result"


_OTLP_KINDS = {0: INTERNAL, 1: INTERNAL, 2: SERVER, 3: CLIENT, 4: PRODUCER, 5: CONSUMER}


def _ns(value: int | str, where: str) -> int:
    if isinstance(value, str):
        try:
            v = int(value)
        except ValueError:
            raise TraceFormatError(f"{where}: {value[:40]!r} is not an integer") from None
    else:
        v = value
    if not 0 <= v <= MAX_NS:
        raise TraceFormatError(f"{where}: {v} ns is out of range (0 – {MAX_NS})")
    return v


def read_otlp_json(doc: bytes, where: str, out: SpanRows) -> None:
    """Append the spans of one OTLP/JSON document."""
    d: _ODoc = _decode(doc, _ODoc, where)
    rss = d.resourceSpans if d.resourceSpans is not None else (d.result or _OResult()).resourceSpans
    if d.resourceSpans is None and d.result is None:
        raise TraceFormatError(f"{where}: not OTLP JSON (expected a 'resourceSpans' list)")
    out.complete = False  # an exporter's batch holds parts of traces
    rows = out.rows
    kinds = _OTLP_KINDS
    for ri, rs in enumerate(rss):
        svc = ""
        for kv in rs.resource.attributes if rs.resource else ():
            if kv.key == "service.name":
                svc = str(_otlp_value(kv.value) or "")
        if rs.resource:
            out.note_node(svc, ((kv.key, _otlp_value(kv.value)) for kv in rs.resource.attributes))
        for ci, sc in enumerate(rs.scopeSpans or rs.instrumentationLibrarySpans):
            for si, s in enumerate(sc.spans):
                k = s.kind
                if k.__class__ is int:
                    kind = kinds.get(k, INTERNAL)
                else:
                    kind = _kind_code(str(k), f"{_at(where, ri, ci, si)}.kind")
                _, req, resp, peer, proto, has_req, has_resp = _scan(s.attributes, True)
                if s.events and not (has_req and has_resp):
                    ev_req, ev_resp = _events(s.events, kind, True)
                    req = req if has_req else ev_req
                    resp = resp if has_resp else ev_resp
                t0, t1 = s.startTimeUnixNano, s.endTimeUnixNano
                try:
                    t0 = t0 if t0.__class__ is int else int(t0)
                    t1 = t1 if t1.__class__ is int else int(t1)
                    ok = 0 <= t0 <= t1 <= MAX_NS
                except ValueError:
                    ok = False
                if not ok:
                    w = _at(where, ri, ci, si)
                    t0 = _ns(s.startTimeUnixNano, f"{w}.startTimeUnixNano")
                    t1 = _ns(s.endTimeUnixNano, f"{w}.endTimeUnixNano")
                    raise TraceFormatError(f"{w}.endTimeUnixNano: {t1} ends before the start {t0}")
                rows.append(
                    (
                        s.traceId,
                        s.spanId,
                        s.parentSpanId,
                        svc,
                        kind,
                        t0,  # type: ignore[arg-type]
                        t1 - t0,  # type: ignore[operator]
                        req,
                        resp,
                        peer,
                        proto,
                    )
                )


def _at(where: str, ri: int, ci: int, si: int) -> str:
    return f"{where}: resourceSpans[{ri}].scopeSpans[{ci}].spans[{si}]"


def read_otlp_proto(data: bytes, where: str, out: SpanRows) -> None:
    """Append the spans of one OTLP protobuf message (``TracesData`` or
    ``ExportTraceServiceRequest``: the same wire layout)."""
    try:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
    except ImportError:
        raise TraceFormatError(
            "reading OTLP protobuf needs the opentelemetry-proto package: "
            "pip install opentelemetry-proto"
        ) from None
    if not data:
        raise TraceFormatError(f"{where}: empty file")
    msg = TracesData()
    try:
        msg.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError) as e:
        raise TraceFormatError(f"{where}: not OTLP protobuf ({e}; truncated file?)") from None
    out.complete = False
    rows = out.rows

    def val(v: Any) -> Any:
        which = v.WhichOneof("value")
        return getattr(v, which) if which in ("string_value", "int_value", "double_value") else None

    for rs in msg.resource_spans:
        svc = ""
        for kv in rs.resource.attributes:
            if kv.key == "service.name":
                svc = kv.value.string_value
        out.note_node(svc, ((kv.key, kv.value.string_value) for kv in rs.resource.attributes))
        for sc in rs.scope_spans:
            for s in sc.spans:
                kind = _OTLP_KINDS.get(int(s.kind), INTERNAL)
                a = _Attrs()
                for kv in s.attributes:
                    a.add(kv.key, val(kv.value))
                for ev in s.events:
                    a.event(((kv.key, val(kv.value)) for kv in ev.attributes), kind)
                t0, t1 = s.start_time_unix_nano, s.end_time_unix_nano
                if t0 > MAX_NS or t1 > MAX_NS or t1 < t0:
                    raise TraceFormatError(
                        f"{where}: span {s.span_id.hex()}: times {t0}–{t1} ns out of range"
                    )
                req, resp = a.sizes()
                rows.append(
                    (
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        svc,
                        kind,
                        t0,
                        t1 - t0,
                        req,
                        resp,
                        a.peer,
                        a.proto,
                    )
                )
