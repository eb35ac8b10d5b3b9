"""Distributed-trace importers (Jaeger JSON, OTLP JSON and protobuf, Zipkin v2 JSON) to ECGs.

Every format is first read into :class:`Span` records, then one rule turns spans into calls:

- one RPC is one invocation: a server (or consumer) span whose parent is a client (or
  producer) span pairs with it; the call's start and duration are the client's (what the
  caller waits for). A client span with no server child is a call to an uninstrumented
  service named by ``peer.service``/``server.address``/``net.peer.name`` (else dropped,
  counted). A server span without a client parent is an entry call from outside the graph;
- internal spans are never hops: they are walked through to find the calling service's
  enclosing call;
- sizes from standard attributes (``http.request_content_length``,
  ``http.request.body.size``, ``rpc.message.uncompressed_size``, ``messaging.message.body.size``
  and the response counterparts), else the options' defaults;
- rates: ``SpanOptions.rate`` if given, else the number of calls of each caller→callee pair
  divided by the traces' time window (``window_s`` or last end − first start);
- service names: :func:`k8s_name` rule (lower case, cut at the first ``.`` — Istio reports
  ``<service>.<namespace>`` —, ``_`` → ``-``), then an override map (file: :func:`load_service_map`).

A child outside its parent's time interval (clock skew between hosts) is clamped into it and
counted; a trace that still fails :func:`~meshtax.model.ecg.validate` is dropped and counted.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from meshtax.model.ecg import (
    DEFAULT_MESSAGE_BYTES,
    ECG,
    EXTERNAL,
    ECGError,
    Invocation,
    Service,
    validate,
)
from meshtax.model.sidecar import SidecarConfig
from meshtax.traces.alibaba import TraceFormatError
from meshtax.traces.report import ImportReport

CLIENT_KINDS = ("client", "producer")
SERVER_KINDS = ("server", "consumer")
REQ_SIZE_KEYS = (
    "http.request_content_length",
    "http.request.body.size",
    "http.request.header.content-length",
    "rpc.request.size",
    "rpc.message.uncompressed_size",
    "messaging.message.body.size",
)
RESP_SIZE_KEYS = (
    "http.response_content_length",
    "http.response.body.size",
    "http.response.header.content-length",
    "rpc.response.size",
)
PEER_KEYS = ("peer.service", "server.address", "net.peer.name", "rpc.service", "db.system")


@dataclass(frozen=True)
class Span:
    """One span, format-independent. Times in µs since the epoch."""

    trace_id: str
    span_id: str
    parent_id: str | None
    service: str
    kind: str  # client | server | producer | consumer | internal
    name: str
    start_us: float
    duration_us: float
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanOptions:
    """Options of the span importers.

    ``request_bytes``/``response_bytes``: sizes when no attribute gives them. ``rate``: requests/s
    of every call (None: counted over the window). ``window_s``: the window for counted rates
    (None: the traces' own span). ``service_map``: trace name → Kubernetes name overrides.
    ``sidecars``: configuration per (mapped) service; others get ``default_sidecar``.
    """

    request_bytes: float = DEFAULT_MESSAGE_BYTES
    response_bytes: float = DEFAULT_MESSAGE_BYTES
    rate: float | None = None
    window_s: float | None = None
    service_map: Mapping[str, str] = field(default_factory=dict)
    sidecars: Mapping[str, SidecarConfig] = field(default_factory=dict)
    default_sidecar: SidecarConfig = SidecarConfig()


def k8s_name(name: str) -> str:
    """The documented default mapping from a tracer's service name to a Kubernetes service name."""
    base = name.strip().split(".", 1)[0]
    return base.lower().replace("_", "-")


def load_service_map(path: str | os.PathLike[str]) -> dict[str, str]:
    """Overrides ``{trace service name: kubernetes service name}`` from a YAML or JSON mapping."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TraceFormatError(f"{path}: cannot read the service map ({e})") from None
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise TraceFormatError(
            f"{path}: expected a mapping of trace service names to Kubernetes service names"
        )
    return dict(doc)


# ---- readers ------------------------------------------------------------------------------


def _load_json(path: Path) -> Any:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{path}: cannot read ({e})") from None
    if not text.strip():
        raise TraceFormatError(f"{path}: empty file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg} (truncated file?)"
        ) from None


def _num(v: Any, where: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TraceFormatError(f"{where}: {v!r} is not a number") from None


def _int(v: Any, where: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise TraceFormatError(f"{where}: {v!r} is not an integer") from None


def read_jaeger(path: Path) -> list[Span]:
    """Jaeger query-API JSON: ``{"data": [{"traceID", "spans": [...], "processes": {...}}]}``."""
    doc = _load_json(path)
    traces = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(traces, list):
        raise TraceFormatError(
            f"{path}: not Jaeger JSON (expected an object with a 'data' list of traces)"
        )
    out: list[Span] = []
    for ti, t in enumerate(traces):
        if not isinstance(t, dict) or not isinstance(t.get("spans"), list):
            raise TraceFormatError(f"{path}: data[{ti}]: expected a trace with a 'spans' list")
        procs = t.get("processes") or {}
        for si, s in enumerate(t["spans"]):
            where = f"{path}: data[{ti}].spans[{si}]"
            if not isinstance(s, dict):
                raise TraceFormatError(f"{where}: expected an object")
            tags = {
                str(x.get("key")): x.get("value")
                for x in s.get("tags") or []
                if isinstance(x, dict)
            }
            parent = None
            for r in s.get("references") or []:
                if isinstance(r, dict) and r.get("refType", "CHILD_OF") in (
                    "CHILD_OF",
                    "FOLLOWS_FROM",
                ):
                    parent = str(r.get("spanID"))
                    break
            proc = procs.get(s.get("processID")) or s.get("process") or {}
            try:
                tid, sid = str(s.get("traceID") or t.get("traceID")), str(s["spanID"])
            except KeyError:
                raise TraceFormatError(f"{where}: missing spanID") from None
            out.append(
                Span(
                    tid,
                    sid,
                    parent,
                    str(proc.get("serviceName", "")),
                    str(tags.get("span.kind", "internal")).lower(),
                    str(s.get("operationName", "")),
                    _num(s.get("startTime"), f"{where}.startTime"),
                    _num(s.get("duration"), f"{where}.duration"),
                    tags,
                )
            )
    return out


_OTLP_KINDS = {0: "internal", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _otlp_value(v: Mapping[str, Any]) -> Any:
    for k in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if k in v:
            return v[k]
    return None


def _otlp_kind(k: Any) -> str:
    if isinstance(k, int):
        return _OTLP_KINDS.get(k, "internal")
    s = str(k).lower().replace("span_kind_", "")
    return s if s in ("server", "client", "producer", "consumer") else "internal"


def read_otlp_json(path: Path) -> list[Span]:
    """OTLP/JSON (``TracesData``/``ExportTraceServiceRequest``): ``{"resourceSpans": [...]}``."""
    doc = _load_json(path)
    rss = doc.get("resourceSpans", doc.get("resource_spans")) if isinstance(doc, dict) else None
    if not isinstance(rss, list):
        raise TraceFormatError(
            f"{path}: not OTLP JSON (expected an object with a 'resourceSpans' list)"
        )
    out: list[Span] = []
    for ri, rs in enumerate(rss):
        attrs = {
            a["key"]: _otlp_value(a.get("value", {}))
            for a in (rs.get("resource") or {}).get("attributes", [])
            if isinstance(a, dict) and "key" in a
        }
        svc = str(attrs.get("service.name", ""))
        for sc in rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", [])) or []:
            for si, s in enumerate(sc.get("spans") or []):
                where = f"{path}: resourceSpans[{ri}].spans[{si}]"
                try:
                    # integer nanoseconds: epoch ns exceed float64's exact range
                    s_ns = _int(s["startTimeUnixNano"], where)
                    e_ns = _int(s["endTimeUnixNano"], where)
                    tid, sid = str(s["traceId"]), str(s["spanId"])
                except KeyError as e:
                    raise TraceFormatError(f"{where}: missing {e.args[0]}") from None
                sattrs = {
                    a["key"]: _otlp_value(a.get("value", {}))
                    for a in s.get("attributes") or []
                    if isinstance(a, dict) and "key" in a
                }
                out.append(
                    Span(
                        tid,
                        sid,
                        s.get("parentSpanId") or None,
                        svc,
                        _otlp_kind(s.get("kind", 0)),
                        str(s.get("name", "")),
                        s_ns / 1000.0,
                        (e_ns - s_ns) / 1000.0,
                        sattrs,
                    )
                )
    return out


def read_otlp_proto(path: Path) -> list[Span]:
    """OTLP protobuf (``TracesData`` or ``ExportTraceServiceRequest``, same wire layout)."""
    try:
        from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
    except ImportError:
        raise TraceFormatError(
            "reading OTLP protobuf needs the opentelemetry-proto package: pip install opentelemetry-proto"
        ) from None
    from google.protobuf.message import DecodeError

    data = TracesData()
    raw = path.read_bytes()
    if not raw:
        raise TraceFormatError(f"{path}: empty file")
    try:
        data.ParseFromString(raw)
    except DecodeError as e:
        raise TraceFormatError(f"{path}: not OTLP protobuf ({e}; truncated file?)") from None
    out: list[Span] = []
    for rs in data.resource_spans:
        svc = ""
        for a in rs.resource.attributes:
            if a.key == "service.name":
                svc = a.value.string_value
        for sc in rs.scope_spans:
            for s in sc.spans:
                attrs: dict[str, Any] = {}
                for a in s.attributes:
                    which = a.value.WhichOneof("value")
                    attrs[a.key] = getattr(a.value, which) if which else None
                out.append(
                    Span(
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex() or None,
                        svc,
                        _OTLP_KINDS.get(int(s.kind), "internal"),
                        s.name,
                        s.start_time_unix_nano / 1000.0,
                        (s.end_time_unix_nano - s.start_time_unix_nano) / 1000.0,
                        attrs,
                    )
                )
    return out


def read_zipkin(path: Path) -> list[Span]:
    """Zipkin v2 JSON: a list of spans (or a list of traces, each a list of spans)."""
    doc = _load_json(path)
    if not isinstance(doc, list):
        raise TraceFormatError(f"{path}: not Zipkin v2 JSON (expected a list of spans)")
    flat = [s for t in doc for s in t] if doc and all(isinstance(t, list) for t in doc) else doc
    out: list[Span] = []
    for si, s in enumerate(flat):
        where = f"{path}: span [{si}]"
        if not isinstance(s, dict):
            raise TraceFormatError(f"{where}: expected an object")
        try:
            tid, sid = str(s["traceId"]), str(s["id"])
        except KeyError as e:
            raise TraceFormatError(f"{where}: missing {e.args[0]}") from None
        kind = str(s.get("kind", "internal")).lower()
        parent = s.get("parentId")
        if kind == "server" and s.get("shared"):
            # a shared span id: the server half of the client span with the same id
            parent, sid = sid, sid + ":server"
        tags = dict(s.get("tags") or {})
        remote = (s.get("remoteEndpoint") or {}).get("serviceName")
        if remote and "peer.service" not in tags:
            tags["peer.service"] = remote
        out.append(
            Span(
                tid,
                sid,
                parent,
                str((s.get("localEndpoint") or {}).get("serviceName", "")),
                kind,
                str(s.get("name", "")),
                _num(s.get("timestamp"), f"{where}.timestamp"),
                _num(s.get("duration", 0), f"{where}.duration"),
                tags,
            )
        )
    return out


READERS = {
    "jaeger": read_jaeger,
    "otlp": read_otlp_json,
    "otlp-proto": read_otlp_proto,
    "zipkin": read_zipkin,
}


# ---- spans → calls -----------------------------------------------------------------------


def _size(attrs: Mapping[str, Any], keys: Sequence[str], default: float) -> float:
    for k in keys:
        if k in attrs:
            try:
                v = float(attrs[k])
            except (TypeError, ValueError):
                continue
            if v >= 0:
                return v
    return default


def _protocol(attrs: Mapping[str, Any]) -> str:
    """The application protocol by OpenTelemetry semantic conventions: ``rpc.system: grpc``,
    else any ``http.*`` attribute; "" when the span does not say."""
    if str(attrs.get("rpc.system", "")).lower() == "grpc":
        return "grpc"
    if any(k.startswith("http.") for k in attrs):
        return "http"
    return ""


@dataclass
class _Call:
    id: str
    caller: str
    callee: str
    start: float
    dur: float
    req: float
    resp: float
    parent: str | None
    protocol: str
    owner: (
        str  # span id whose descendants are inside this call (the server span, or the client span)
    )


def spans_to_ecgs(spans: Iterable[Span], options: SpanOptions, report: ImportReport) -> list[ECG]:
    """Pair spans into calls and build one validated ECG per trace; counts go to ``report``."""
    by_trace: dict[str, list[Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    report.rows_read += sum(len(v) for v in by_trace.values())
    report.graphs_seen += len(by_trace)

    def name(raw: str) -> str:
        return options.service_map.get(raw) or k8s_name(raw) if raw else ""

    built: list[tuple[str, list[_Call]]] = []
    pair_counts: Counter[tuple[str, str]] = Counter()
    t_lo, t_hi = float("inf"), float("-inf")
    for tid, ss in by_trace.items():
        byid = {s.span_id: s for s in ss}
        if len(byid) != len(ss):
            report.notes["duplicate span id (kept the last)"] += len(ss) - len(byid)
        children: dict[str, list[Span]] = {}
        for s in byid.values():
            if s.parent_id is not None and s.parent_id not in byid:
                report.notes["parent span missing: taken as a root"] += 1
            children.setdefault(s.parent_id if s.parent_id in byid else "", []).append(s)
        calls: list[_Call] = []
        call_of_span: dict[str, str] = {}  # span id → id of the call it is inside
        # walk from roots; a span's enclosing call is inherited unless the span starts a call
        stack: list[tuple[Span, str | None]] = [(s, None) for s in children.get("", [])]
        seen: set[str] = set()
        while stack:
            s, enclosing = stack.pop()
            if s.span_id in seen:
                report.notes["span cycle broken"] += 1
                continue
            seen.add(s.span_id)
            here = enclosing
            if s.kind in CLIENT_KINDS:
                server = next(
                    (c for c in children.get(s.span_id, []) if c.kind in SERVER_KINDS), None
                )
                callee_raw = (
                    server.service
                    if server
                    else next((str(s.attrs[k]) for k in PEER_KEYS if s.attrs.get(k)), "")
                )
                if not callee_raw:
                    report.dropped_rows["client span without a server span or peer name"] += 1
                else:
                    merged = {**s.attrs, **(server.attrs if server else {})}
                    c = _Call(
                        s.span_id,
                        name(s.service),
                        name(callee_raw),
                        s.start_us,
                        s.duration_us,
                        _size(merged, REQ_SIZE_KEYS, options.request_bytes),
                        _size(merged, RESP_SIZE_KEYS, options.response_bytes),
                        enclosing,
                        _protocol(merged),
                        s.span_id,
                    )
                    calls.append(c)
                    here = c.id
                    if server is not None:
                        report.rows_merged += 1
                        seen.add(server.span_id)
                        call_of_span[server.span_id] = here
                        stack.extend((k, here) for k in children.get(server.span_id, []))
            elif s.kind in SERVER_KINDS:
                c = _Call(
                    s.span_id,
                    EXTERNAL,
                    name(s.service),
                    s.start_us,
                    s.duration_us,
                    _size(s.attrs, REQ_SIZE_KEYS, options.request_bytes),
                    _size(s.attrs, RESP_SIZE_KEYS, options.response_bytes),
                    enclosing,
                    _protocol(s.attrs),
                    s.span_id,
                )
                if enclosing is not None:
                    # a server span under a non-client span: called by the enclosing call's callee
                    report.notes[
                        "server span without a client span: caller taken from the enclosing call"
                    ] += 1
                calls.append(c)
                here = c.id
            call_of_span[s.span_id] = here if here is not None else ""
            stack.extend(
                (k, here) for k in children.get(s.span_id, []) if k.span_id not in call_of_span
            )
        if not calls:
            report.dropped_graphs["no client/server span pairs (only internal spans?)"] += 1
            continue
        byc = {c.id: c for c in calls}
        for c in calls:
            if c.parent is not None:
                p = byc[c.parent]
                if c.caller == EXTERNAL or c.caller != p.callee:
                    if c.caller != EXTERNAL:
                        report.notes[
                            "caller differs from the enclosing call's callee: used the callee"
                        ] += 1
                    c.caller = p.callee
                # clock skew: clamp into the parent's interval
                lo, hi = p.start, p.start + p.dur
                if c.start < lo or c.start + c.dur > hi:
                    report.notes["call outside its parent's interval (clock skew?): clamped"] += 1
                    c.start = min(max(c.start, lo), hi)
                    c.dur = max(0.0, min(c.start + c.dur, hi) - c.start)
            pair_counts[(c.caller, c.callee)] += 1
            t_lo, t_hi = min(t_lo, c.start), max(t_hi, c.start + c.dur)
        built.append((tid, calls))
    window = options.window_s if options.window_s else max((t_hi - t_lo) * 1e-6, 1e-6)
    if options.rate is None and built:
        report.notes[f"rates counted over a {window:g} s window"] += 1
    ecgs: list[ECG] = []
    for tid, calls in built:
        t0 = min(c.start for c in calls)
        invs = [
            Invocation(
                id=c.id,
                caller=c.caller,
                callee=c.callee,
                request_bytes=c.req,
                response_bytes=c.resp,
                rate=options.rate
                if options.rate is not None
                else pair_counts[(c.caller, c.callee)] / window,
                start_us=c.start - t0,
                duration_us=c.dur,
                parent=c.parent,
                protocol=c.protocol,
            )
            for c in calls
        ]
        names = sorted({i.callee for i in invs} | {i.caller for i in invs if i.caller != EXTERNAL})
        services = {n: Service(n, options.sidecars.get(n, options.default_sidecar)) for n in names}
        try:
            e = validate(tid, services, invs, source=f"trace {tid}")
        except ECGError as err:
            report.dropped_graphs[
                f"invalid call graph: {err.problems[0].split(':', 1)[-1].strip()[:80]}"
            ] += 1
            continue
        ecgs.append(e)
        report.graphs_kept += 1
        report.rows_used += len(invs)
    return ecgs


def load_spans(
    paths: Sequence[str | os.PathLike[str]], format: str, options: SpanOptions
) -> tuple[list[ECG], ImportReport]:
    """Read span files of one format and build their ECGs (one per trace)."""
    try:
        reader = READERS[format]
    except KeyError:
        raise TraceFormatError(f"format {format!r}: expected one of {', '.join(READERS)}") from None
    rep = ImportReport(", ".join(map(str, paths)), format)
    spans: list[Span] = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise TraceFormatError(f"{path}: no such file")
        spans.extend(reader(path))
    return spans_to_ecgs(spans, options, rep), rep
