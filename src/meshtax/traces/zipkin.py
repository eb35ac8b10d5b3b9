"""Zipkin v2 JSON span documents (a list of spans, or a list of traces) into span rows (see
:mod:`meshtax.traces.decode`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
from msgspec import Struct

from meshtax.traces.decode import (
    SERVER,
    Micros,
    SpanRows,
    _Attrs,
    _decode,
    _kind_code,
)
from meshtax.traces.errors import TraceFormatError


class _ZEndpoint(Struct, gc=False):
    serviceName: str | None = None


class _ZAnnotation(Struct, gc=False):
    value: str = ""


class _ZSpan(Struct, gc=False):
    traceId: str
    id: str
    timestamp: Micros
    duration: Micros = 0
    parentId: str | None = None
    kind: str | None = None
    localEndpoint: _ZEndpoint | None = None
    remoteEndpoint: _ZEndpoint | None = None
    tags: dict[str, str] = {}
    annotations: list[_ZAnnotation] = []
    shared: bool = False


def _zipkin_event(value: str) -> Iterator[tuple[str, Any]]:
    """The attributes of an OpenTelemetry event exported as a Zipkin annotation
    (``{"<event name>": {attributes}}``); nothing for a plain annotation."""
    if not value.startswith("{") or len(value) > 4096:
        return
    try:
        doc = msgspec.json.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return
    if isinstance(doc, dict):
        for attrs in doc.values():
            if isinstance(attrs, dict):
                yield from attrs.items()


def read_zipkin(doc: bytes, where: str, out: SpanRows) -> None:
    """Append the spans of a Zipkin v2 document: a list of spans, or a list of traces."""
    s = doc.lstrip()[:1]
    if s != b"[":
        raise TraceFormatError(f"{where}: not Zipkin v2 JSON (expected a list of spans)")
    nested = doc.lstrip()[1:].lstrip()[:1] == b"["
    spans: list[_ZSpan]
    if nested:
        spans = [x for t in _decode(doc, list[list[_ZSpan]], where) for x in t]
    else:
        spans = _decode(doc, list[_ZSpan], where)
        out.complete = False
    rows = out.rows
    # B3's one span per RPC (Brave, Envoy's Zipkin tracer): the server half reuses the client's
    # id, flagged ``shared`` (or not, by older converters). It becomes a child of the client
    # under an id of its own; the calls it makes, which name the shared id as their parent,
    # are moved under it by the pairing (:mod:`meshtax.traces.pairing`).
    clients = {(z.traceId, z.id) for z in spans if (z.kind or "").upper() == "CLIENT"}
    for si, z in enumerate(spans):
        kind = _kind_code(z.kind, f"{where}: [{si}].kind")
        a = _Attrs()
        for k, v in z.tags.items():
            a.add(k, v)
        for ann in z.annotations:
            a.event(_zipkin_event(ann.value), kind)
        if not a.peer and z.remoteEndpoint is not None and z.remoteEndpoint.serviceName:
            a.peer = z.remoteEndpoint.serviceName
        sid, parent = z.id, z.parentId or ""
        if kind == SERVER and (z.shared or (z.traceId, sid) in clients):
            # a shared span id: the server half of the client span with the same id
            parent, sid = sid, sid + ":server"
        req, resp = a.sizes()
        rows.append(
            (
                z.traceId,
                sid,
                parent,
                (z.localEndpoint.serviceName or "") if z.localEndpoint else "",
                kind,
                z.timestamp * 1000,
                z.duration * 1000,
                req,
                resp,
                a.peer,
                a.proto,
            )
        )
