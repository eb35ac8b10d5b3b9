"""Span importers: one trace in Jaeger, OTLP (JSON and protobuf) and Zipkin gives one ECG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshtax.model.ecg import ECG, EXTERNAL
from meshtax.traces.alibaba import TraceFormatError
from meshtax.traces.api import detect_format, load_traces
from meshtax.traces.report import ImportReport
from meshtax.traces.spans import Span, SpanOptions, k8s_name, load_service_map, spans_to_ecgs

FIX = Path(__file__).parent / "fixtures"
# (caller, callee, start, duration, request, response, parent callee) — read off make_fixtures.py
EXPECTED = {
    ("", "frontend", 0.0, 1000.0, 120.0, 5000.0, None),
    ("frontend", "cart", 100.0, 300.0, 100.0, 100.0, "frontend"),
    ("cart", "redis", 150.0, 100.0, 100.0, 100.0, "cart"),
    ("frontend", "catalog", 150.0, 350.0, 300.0, 2048.0, "frontend"),
    ("frontend", "checkout-service", 600.0, 250.0, 100.0, 100.0, "frontend"),
    ("checkout-service", "payment", 620.0, 80.0, 100.0, 100.0, "checkout-service"),
}


def _calls(ecg: ECG) -> set[tuple[Any, ...]]:
    by = {i.id: i for i in ecg.invocations}
    return {
        (
            i.caller,
            i.callee,
            i.start_us,
            i.duration_us,
            i.request_bytes,
            i.response_bytes,
            None if i.parent is None else by[i.parent].callee,
        )
        for i in ecg.invocations
    }


@pytest.mark.parametrize("fmt", ["jaeger", "otlp", "zipkin"])
def test_fixture_gives_expected_calls(fmt: str) -> None:
    path = FIX / f"trace.{fmt}.json"
    assert detect_format(path) == fmt
    r = load_traces(path, options=SpanOptions(rate=30000.0))
    assert len(r.ecgs) == 1 and r.report.graphs_kept == 1
    assert _calls(r.ecgs[0]) == EXPECTED
    assert (
        r.report.rows_read == 12 and r.report.rows_merged == 4
    )  # 4 client/server pairs, 2 internal spans
    assert r.batch.n_invocations == 6


def test_three_formats_same_ecg() -> None:
    ecgs = [load_traces(FIX / f"trace.{f}.json").ecgs for f in ("jaeger", "otlp", "zipkin")]
    assert ecgs[0] == ecgs[1] == ecgs[2]


def test_otlp_protobuf_same_ecg(tmp_path: Path) -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import (
        ResourceSpans,
        ScopeSpans,
        TracesData,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import (
        Span as PbSpan,
    )

    doc = json.loads((FIX / "trace.otlp.json").read_text())
    kinds = {"SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3}
    data = TracesData()
    for rs in doc["resourceSpans"]:
        out = ResourceSpans()
        out.resource.attributes.append(
            KeyValue(
                key="service.name",
                value=AnyValue(
                    string_value=rs["resource"]["attributes"][0]["value"]["stringValue"]
                ),
            )
        )
        sc = ScopeSpans()
        for s in rs["scopeSpans"][0]["spans"]:
            attrs = [
                KeyValue(
                    key=a["key"],
                    value=AnyValue(int_value=int(a["value"]["intValue"]))
                    if "intValue" in a["value"]
                    else AnyValue(string_value=a["value"]["stringValue"]),
                )
                for a in s["attributes"]
            ]
            sc.spans.append(
                PbSpan(
                    trace_id=bytes.fromhex(s["traceId"]),
                    span_id=bytes.fromhex(s["spanId"]),
                    parent_span_id=bytes.fromhex(s["parentSpanId"]),
                    name=s["name"],
                    kind=kinds[s["kind"]],  # type: ignore[arg-type]
                    start_time_unix_nano=int(s["startTimeUnixNano"]),
                    end_time_unix_nano=int(s["endTimeUnixNano"]),
                    attributes=attrs,
                )
            )
        out.scope_spans.append(sc)
        data.resource_spans.append(out)
    p = tmp_path / "trace.pb"
    p.write_bytes(data.SerializeToString())
    assert load_traces(p).ecgs == load_traces(FIX / "trace.otlp.json").ecgs


def test_rates_counted_over_window() -> None:
    r = load_traces(FIX / "trace.jaeger.json", options=SpanOptions(window_s=10.0))
    assert {i.rate for i in r.ecgs[0].invocations} == {0.1}  # each pair once in 10 s


def test_service_name_rule_and_override(tmp_path: Path) -> None:
    assert k8s_name("Checkout_Service.default") == "checkout-service"
    m = tmp_path / "map.yaml"
    m.write_text("Checkout_Service.default: checkout\n")
    r = load_traces(FIX / "trace.zipkin.json", options=SpanOptions(service_map=load_service_map(m)))
    assert "checkout" in r.ecgs[0].services and "checkout-service" not in r.ecgs[0].services
    m.write_text("- a\n")
    with pytest.raises(TraceFormatError, match="mapping"):
        load_service_map(m)


def test_zipkin_shared_span_ids(tmp_path: Path) -> None:
    spans = [
        {
            "traceId": "t",
            "id": "1",
            "kind": "SERVER",
            "timestamp": 0,
            "duration": 100,
            "localEndpoint": {"serviceName": "a"},
        },
        {
            "traceId": "t",
            "id": "2",
            "parentId": "1",
            "kind": "CLIENT",
            "timestamp": 10,
            "duration": 50,
            "localEndpoint": {"serviceName": "a"},
        },
        {
            "traceId": "t",
            "id": "2",
            "parentId": "1",
            "kind": "SERVER",
            "shared": True,
            "timestamp": 12,
            "duration": 40,
            "localEndpoint": {"serviceName": "b"},
        },
    ]
    # b's own call names the shared id as its parent (B3 propagation): it is b's, under b's
    # server half — not a second client of a's call
    spans.append(
        {
            "traceId": "t",
            "id": "3",
            "parentId": "2",
            "kind": "CLIENT",
            "timestamp": 15,
            "duration": 20,
            "localEndpoint": {"serviceName": "b"},
            "remoteEndpoint": {"serviceName": "db"},
        }
    )
    p = tmp_path / "z.json"
    p.write_text(json.dumps(spans))
    e = load_traces(p, "zipkin").ecgs[0]
    calls = {(i.caller, i.callee) for i in e.invocations}
    assert calls == {(EXTERNAL, "a"), ("a", "b"), ("b", "db")}
    # an older converter's server half without the flag: the same id as a client span
    del spans[2]["shared"]
    p.write_text(json.dumps(spans))
    assert {(i.caller, i.callee) for i in load_traces(p, "zipkin").ecgs[0].invocations} == calls


@pytest.mark.parametrize("fmt", ["jaeger", "otlp", "zipkin"])
def test_truncated_json(tmp_path: Path, fmt: str) -> None:
    text = (FIX / f"trace.{fmt}.json").read_text()
    p = tmp_path / "t.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(TraceFormatError, match="invalid JSON"):
        load_traces(p, fmt)


@pytest.mark.parametrize("fmt", ["jaeger", "otlp", "zipkin", "otlp-proto"])
def test_empty_and_wrong_shape(tmp_path: Path, fmt: str) -> None:
    p = tmp_path / "e.json"
    p.write_text("")
    with pytest.raises(TraceFormatError):
        load_traces(p, fmt)
    p.write_text('{"foo": 1}' if fmt != "zipkin" else '{"data": []}')
    with pytest.raises(TraceFormatError):
        load_traces(p, fmt)


def test_clock_skew_clamped_and_orphans_counted() -> None:
    s = [
        Span("t", "1", None, "a", "server", "x", 0, 100),
        Span("t", "2", "1", "a", "client", "y", 90, 50),  # ends after its parent: skew
        Span("t", "3", "2", "b", "server", "y", 95, 40),
        Span("t", "4", "gone", "c", "server", "z", 0, 10),  # parent span missing
        Span("u", "1", None, "a", "internal", "i", 0, 1),  # no calls at all
    ]
    rep = ImportReport("x", "test")
    ecgs = spans_to_ecgs(s, SpanOptions(rate=1.0), rep)
    assert rep.graphs_seen == 2 and rep.graphs_kept == 1 and rep.graphs_dropped == 1
    assert rep.notes["call outside its parent's interval (clock skew?): clamped"] == 1
    assert rep.notes["parent span missing: taken as a root"] == 1
    inv = {i.callee: i for i in ecgs[0].invocations}
    assert inv["b"].start_us + inv["b"].duration_us <= 100


SHARED_NOTE = "spans under their caller's client span (a shared span id): moved under its server"


def test_a_callees_spans_under_the_callers_client_span_move_under_its_server() -> None:
    # Jaeger's query gives a shared id's server half a new id, not its children: b's call to
    # the database names a's client span as its parent
    s = [
        Span("t", "1", None, "a", "server", "x", 0, 100),
        Span("t", "2", "1", "a", "client", "y", 10, 80),
        Span("t", "3", "2", "b", "server", "y", 12, 76),
        Span("t", "4", "2", "b", "client", "q", 20, 30, {"peer.service": "db"}),
        Span("t", "5", "4", "b", "internal", "retry", 21, 1),
    ]
    rep = ImportReport("x", "test")
    (g,) = spans_to_ecgs(s, SpanOptions(rate=1.0), rep)
    assert {(i.caller, i.callee) for i in g.invocations} == {
        (EXTERNAL, "a"),
        ("a", "b"),
        ("b", "db"),
    }
    assert rep.notes[SHARED_NOTE] == 1
    # …but not a span whose move would hang it under itself (b's server inside b's span)
    s[2] = Span("t", "3", "6", "b", "server", "y", 12, 76)
    s.append(Span("t", "6", "2", "b", "internal", "mw", 11, 78))
    rep = ImportReport("x", "test")
    (g,) = spans_to_ecgs(s, SpanOptions(rate=1.0), rep)
    assert ("a", "b") in {(i.caller, i.callee) for i in g.invocations}
    assert rep.notes[SHARED_NOTE] == 1 and rep.graphs_dropped == 0


span_st = st.builds(
    Span,
    st.sampled_from(["t1", "t2"]),
    st.sampled_from(["1", "2", "3", "4", "5"]),
    st.one_of(st.none(), st.sampled_from(["1", "2", "3", "4", "5", "x"])),
    st.sampled_from(["a", "b", "c.ns", ""]),
    st.sampled_from(["client", "server", "internal", "producer", "consumer"]),
    st.just("op"),
    st.integers(0, 100).map(float),
    st.integers(0, 100).map(float),
    st.fixed_dictionaries(
        {},
        optional={
            "peer.service": st.sampled_from(["p", ""]),
            "http.request_content_length": st.sampled_from([10, "x", -1]),
        },
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(span_st, max_size=12))
def test_fuzz_spans_never_crash_and_balance(spans: list[Span]) -> None:
    rep = ImportReport("x", "fuzz")
    ecgs = spans_to_ecgs(spans, SpanOptions(rate=1.0), rep)
    assert (
        rep.graphs_seen == rep.graphs_kept + rep.graphs_dropped == len({s.trace_id for s in spans})
    )
    assert len(ecgs) == rep.graphs_kept


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_bytes_give_clear_errors(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    p = tmp_path_factory.mktemp("b") / "f.json"
    p.write_bytes(data)
    for fmt in ("jaeger", "otlp", "zipkin", "otlp-proto"):
        try:
            load_traces(p, fmt)
        except TraceFormatError:
            pass


@pytest.mark.parametrize("fmt", ["jaeger", "otlp", "zipkin"])
def test_protocol_from_semantic_conventions(fmt: str) -> None:
    # rpc.system: grpc → grpc; any http.* attribute → http; nothing said → unknown ("")
    r = load_traces(FIX / f"trace.{fmt}.json", options=SpanOptions(rate=1.0))
    proto = {i.callee: i.protocol for i in r.ecgs[0].invocations}
    assert proto == {
        "frontend": "http",
        "cart": "",
        "redis": "",
        "catalog": "http",
        "checkout-service": "",
        "payment": "grpc",
    }
    codes = r.batch.protocol
    assert codes is not None and sorted(codes.tolist()) == [0, 0, 0, 1, 1, 2]


NODES = {"frontend.default": "n1", "cart.default": "n1", "catalog.default": "n2"}


def _node_attrs(svc: str) -> list[tuple[str, str]]:
    """frontend and cart name a k8s node, catalog only a host, payment both (k8s wins)."""
    if svc == "payment.default":
        return [("host.name", "h9"), ("k8s.node.name", "n3")]
    if svc == "catalog.default":
        return [("host.name", "n2")]
    return [("k8s.node.name", NODES[svc])] if svc in NODES else []


@pytest.mark.parametrize("fmt", ["otlp", "jaeger"])
def test_nodes_from_resource_attributes(fmt: str, tmp_path: Path) -> None:
    from meshtax.predict.architecture import arrange

    doc = json.loads((FIX / f"trace.{fmt}.json").read_text())
    if fmt == "otlp":
        for rs in doc["resourceSpans"]:
            attrs = rs["resource"]["attributes"]
            svc = attrs[0]["value"]["stringValue"]
            attrs += [{"key": k, "value": {"stringValue": v}} for k, v in _node_attrs(svc)]
    else:
        for p in doc["data"][0]["processes"].values():
            p["tags"] = [
                {"key": k, "type": "string", "value": v} for k, v in _node_attrs(p["serviceName"])
            ]
    path = tmp_path / f"trace.{fmt}.json"
    path.write_text(json.dumps(doc))
    b = load_traces(path, options=SpanOptions(rate=100.0)).batch
    assert b.service_node is not None
    node = {s: b.node_names[k] for s, k in zip(b.services, b.service_node) if k >= 0}
    assert node == {"frontend": "n1", "cart": "n1", "catalog": "n2", "payment": "n3"}
    # placed where the traces say: frontend → cart is intra-node under node-l4
    nodes = arrange(b, "node-l4").nodes
    assert nodes["frontend"] == nodes["cart"] != nodes["catalog"]
    # without node attributes nothing is placed
    plain = load_traces(FIX / f"trace.{fmt}.json", options=SpanOptions(rate=100.0)).batch
    assert plain.service_node is not None and (plain.service_node == -1).all()
