"""Span importers' options and readable forms: :class:`SpanOptions`, service naming, the
span-rows → call-graph step of one batch, counted rates, and ECG objects from a paired batch.

The import itself (inputs, batches, workers) is :mod:`meshtax.traces.stream`; documents are
decoded by :mod:`meshtax.traces.decode` (Jaeger), :mod:`~meshtax.traces.otlp` and
:mod:`~meshtax.traces.zipkin`; :mod:`meshtax.traces.pairing` states the pairing rule.

Sizes come from span attributes (current and older semantic-convention names), else from
message events (``rpc.message.uncompressed_size`` of SENT/RECEIVED events), else the
options' defaults (counted). Rates: ``SpanOptions.rate``, else the calls of each
caller→callee pair over the traces' time window (``window_s`` or first start to last end).
Service names: :func:`k8s_name` (lower case, cut at the first ``.`` — Istio reports
``<service>.<namespace>`` —, ``_`` → ``-``), then the override map (:func:`load_service_map`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from meshtax.model.ecg import (
    DEFAULT_MESSAGE_BYTES,
    ECG,
    EXTERNAL,
    PROTOCOLS,
    ECGError,
    Invocation,
    Service,
    validate,
)
from meshtax.model.sidecar import SidecarConfig
from meshtax.traces import decode, inputs
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.jaeger import JaegerRows
from meshtax.traces.pairing import Naming, Paired, SpanColumns, empty, pair, pair_columns
from meshtax.traces.report import ImportReport

FORMATS = ("jaeger", "otlp", "otlp-proto", "zipkin")


@dataclass(frozen=True)
class Span:
    """One span, format-independent, as objects (for inspection and tests; the importers
    use columnar rows). Times in µs since the epoch."""

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

    ``request_bytes``/``response_bytes``: sizes when no attribute or event gives them.
    ``rate``: requests/s of every call (None: counted over the window). ``window_s``: the
    window for counted rates (None: the traces' own span). ``service_map``: trace name →
    Kubernetes name overrides. ``sidecars``: configuration per (mapped) service; others get
    ``default_sidecar``. ``max_skew_us``: a call sticking out of its parent's interval by at
    most this much is clamped into it (clock skew), by more its trace is dropped.
    ``batch_spans``: spans decoded and paired at once (memory: about 2 kB per span of a
    batch, a few batches at a time).
    ``workers``: processes decoding and pairing (None: up to 2, as the CPUs allow).
    """

    request_bytes: float = DEFAULT_MESSAGE_BYTES
    response_bytes: float = DEFAULT_MESSAGE_BYTES
    rate: float | None = None
    window_s: float | None = None
    service_map: Mapping[str, str] = field(default_factory=dict)
    sidecars: Mapping[str, SidecarConfig] = field(default_factory=dict)
    default_sidecar: SidecarConfig = SidecarConfig()
    max_skew_us: float = 10_000.0
    batch_spans: int = 20_000
    workers: int | None = None
    max_document_bytes: int = inputs.MAX_DOCUMENT_BYTES


def k8s_name(name: str) -> str:
    """The documented default mapping from a tracer's service name to a Kubernetes service name."""
    base = name.strip().split(".", 1)[0]
    return base.lower().replace("_", "-")


def load_service_map(path: str | os.PathLike[str]) -> dict[str, str]:
    """Overrides ``{trace service name: kubernetes service name}`` from a YAML or JSON mapping."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TraceFormatError(f"{path}: cannot read the service map ({e})") from None
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise TraceFormatError(
            f"{path}: expected a mapping of trace service names to Kubernetes service names"
        )
    return dict(doc)


def naming(options: SpanOptions) -> Naming:
    """The options' service naming: :func:`k8s_name`, then the override map; sidecars."""
    smap = dict(options.service_map)
    sidecars = dict(options.sidecars)
    default = options.default_sidecar

    @lru_cache(maxsize=4096)
    def rename(raw: str) -> str:
        return smap.get(raw) or k8s_name(raw)

    def sidecar(name: str) -> SidecarConfig:
        return sidecars.get(name, default)

    return Naming(rename, sidecar)


def pair_rows(
    rows: Sequence[decode.Row] | JaegerRows, rep: ImportReport, options: SpanOptions
) -> Paired:
    """The call graphs of the spans of whole traces (see :mod:`meshtax.traces.pairing`):
    span rows, or Jaeger's columns."""
    args = (
        rep,
        naming(options),
        options.rate,
        options.max_skew_us,
        options.request_bytes,
        options.response_bytes,
    )
    if isinstance(rows, JaegerRows):
        return pair_columns(SpanColumns(**rows.columns()), *args) if len(rows) else empty()
    return pair(rows, *args)


def fill_rates(batches: Sequence[Paired], window_s: float | None, report: ImportReport) -> None:
    """Counted rates: calls of each caller→callee pair over the window (``window_s``, else
    the first graph's start to the last graph's end), written into every batch in place."""
    todo = [p for p in batches if p.batch.n_invocations and np.isnan(p.batch.rate).any()]
    if not todo:
        return
    counts: dict[tuple[str, str], int] = {}
    lo, hi = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    for p in todo:
        b = p.batch
        names = (*b.services, "")
        keys, cnt = np.unique(np.stack([b.caller, b.callee]), axis=1, return_counts=True)
        for (a, c), k in zip(keys.T.tolist(), cnt.tolist(), strict=True):
            counts[(names[a], names[c])] = counts.get((names[a], names[c]), 0) + k
        lo, hi = min(lo, int(p.origin_ns.min())), max(hi, int(p.end_ns.max()))
    window = window_s if window_s else max((hi - lo) * 1e-9, 1e-6)
    report.notes[f"rates counted over a {window:g} s window"] += 1
    for p in todo:
        b = p.batch
        names = (*b.services, "")
        per = np.array(
            [
                counts.get((names[a], names[c]), 0) / window
                for a, c in zip(b.caller.tolist(), b.callee.tolist(), strict=True)
            ]
        )
        b.rate[:] = per


# ---- ECG objects (readable form) ----------------------------------------------------------


def to_ecgs(p: Paired, options: SpanOptions) -> list[ECG]:
    """The validated :class:`~meshtax.model.ecg.ECG` of every graph of a paired batch;
    asynchronous calls are listed in each graph's ``meta["asynchronous"]``."""
    b = p.batch
    sidecar = naming(options).sidecar
    names = (*b.services, EXTERNAL)
    protos = b.protocol if b.protocol is not None else np.zeros(b.n_invocations, dtype=np.int64)
    ids = b.row_ids
    out: list[ECG] = []
    for g, gname in enumerate(b.graph_names):
        lo, hi = int(b.graph_ptr[g]), int(b.graph_ptr[g + 1])
        invs = [
            Invocation(
                id=ids[r],
                caller=names[b.caller[r]],
                callee=names[b.callee[r]],
                request_bytes=float(b.request_bytes[r]),
                response_bytes=float(b.response_bytes[r]),
                rate=float(b.rate[r]),
                start_us=float(b.start_us[r]),
                duration_us=float(b.duration_us[r]),
                parent=None if b.parent[r] < 0 else ids[int(b.parent[r])],
                protocol=PROTOCOLS[int(protos[r])],
            )
            for r in range(lo, hi)
        ]
        used = sorted({i.callee for i in invs} | {i.caller for i in invs} - {EXTERNAL})
        services = {s: Service(s, sidecar(s)) for s in used}
        e = validate(gname, services, invs, source=f"trace {gname}")
        asyn = [ids[r] for r in range(lo, hi) if p.asynchronous[r]]
        out.append(ECG(e.name, e.services, e.invocations, {"asynchronous": asyn} if asyn else {}))
    return out


def spans_to_ecgs(spans: Iterable[Span], options: SpanOptions, report: ImportReport) -> list[ECG]:
    """Pair span objects into calls and build one validated ECG per trace (the rule of
    :mod:`meshtax.traces.pairing`); counts go to ``report``."""
    kinds = decode.KIND_CODES
    rows: list[decode.Row] = []
    for s in spans:
        a = decode._Attrs()
        for k, v in s.attrs.items():
            a.add(k, v)
        req, resp = a.sizes()
        start = round(s.start_us * 1000)
        rows.append(
            (
                s.trace_id,
                s.span_id,
                s.parent_id or "",
                s.service,
                kinds.get(s.kind, decode.INTERNAL),
                start,
                max(0, round((s.start_us + s.duration_us) * 1000) - start),
                req,
                resp,
                a.peer,
                a.proto,
            )
        )
    rows.sort(key=lambda r: r[0])
    p = pair_rows(rows, report, options)
    if options.rate is None:
        fill_rates([p], options.window_s, report)
    try:
        return to_ecgs(p, options)
    except ECGError as e:  # pragma: no cover - the pairing keeps graphs valid
        raise TraceFormatError(str(e)) from None


def read_otlp_json(path: str | os.PathLike[str]) -> list[Span]:
    """The spans of an OTLP/JSON file (one document or JSON Lines) as :class:`Span` objects
    with every attribute (for inspection and tests; importing uses the columnar path)."""
    kinds = {0: "internal", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
    out: list[Span] = []
    for _, doc in inputs.documents(inputs.Source(os.fspath(path))):
        d = json.loads(doc)
        for rs in d.get("resourceSpans", []):
            attrs = {
                a["key"]: _json_value(a.get("value", {}))
                for a in (rs.get("resource") or {}).get("attributes", [])
            }
            svc = str(attrs.get("service.name", ""))
            for sc in rs.get("scopeSpans", []):
                for s in sc.get("spans", []):
                    t0, t1 = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
                    k = s.get("kind", 0)
                    out.append(
                        Span(
                            s["traceId"],
                            s["spanId"],
                            s.get("parentSpanId") or None,
                            svc,
                            kinds.get(k, "internal")
                            if isinstance(k, int)
                            else str(k).lower().removeprefix("span_kind_"),
                            s.get("name", ""),
                            t0 / 1000,
                            (t1 - t0) / 1000,
                            {
                                a["key"]: _json_value(a.get("value", {}))
                                for a in s.get("attributes", [])
                            },
                        )
                    )
    return out


def _json_value(v: Mapping[str, Any]) -> Any:
    for k in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if k in v:
            return v[k]
    return None
