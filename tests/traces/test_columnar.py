"""The columnar span import: pairing by the semantic conventions, integer nanoseconds, inputs
as users have them (directories, globs, stdin, gzip, zstd, JSON Lines), batches, the drop
report, and clean errors on malformed files."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.ecg import EXTERNAL
from meshtax.traces import inputs
from meshtax.traces.alibaba import TraceFormatError
from meshtax.traces.api import detect_format, load_traces
from meshtax.traces.pairing import N_ASYNC, N_NESTED, R_UNANSWERED, g_skew
from meshtax.traces.report import ImportReport
from meshtax.traces.spans import SpanOptions
from meshtax.traces.stream import iter_batches

FIX = Path(__file__).parent / "fixtures"
T0 = 1_700_000_000_000_000_123  # epoch ns with nanosecond digits a float cannot hold
TID = "0af7651916cd43dd8448eb211c80319c"


def kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    return {"key": key, "value": {"intValue": str(value)}}


def span(
    sid: str,
    parent: str,
    kind: int,
    start: int,
    end: int,
    attrs: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    tid: str = TID,
) -> dict[str, Any]:
    return {
        "traceId": tid,
        "spanId": sid,
        "parentSpanId": parent,
        "name": sid,
        "kind": kind,
        "startTimeUnixNano": str(T0 + start),
        "endTimeUnixNano": str(T0 + end),
        "attributes": [kv(k, v) for k, v in (attrs or {}).items()],
        "events": events or [],
    }


def doc(by_service: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [kv("service.name", svc)]},
                "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}],
            }
            for svc, spans in by_service.items()
        ]
    }


def write(tmp: Path, name: str, d: Any) -> Path:
    p = tmp / name
    p.write_text(json.dumps(d))
    return p


def hops(path: Path | str, **kw: Any) -> set[tuple[str, str, int, int]]:
    """(caller, callee, start ns, duration ns) of every call of the one graph."""
    r = load_traces(path, "otlp", SpanOptions(rate=1.0, **kw))
    assert len(r.ecgs) == 1, r.report.summary()
    return {
        (i.caller, i.callee, round(i.start_us * 1000), round(i.duration_us * 1000))
        for i in r.ecgs[0].invocations
    }


SERVER, CLIENT, INTERNAL, PRODUCER, CONSUMER = 2, 3, 1, 4, 5


def test_nanoseconds_exact(tmp_path: Path) -> None:
    d = doc(
        {
            "a": [
                span("a1", "", SERVER, 0, 1_000_001),
                span("a2", "a1", CLIENT, 1_001, 500_003, {"peer.service": "b"}),
            ],
            "b": [span("b1", "a2", SERVER, 2_003, 400_005)],
        }
    )
    assert hops(write(tmp_path, "t.json", d)) == {
        (EXTERNAL, "a", 0, 1_000_001),
        ("a", "b", 1_001, 499_002),
    }


def test_json_lines_across_lines_and_files(tmp_path: Path) -> None:
    # the file exporter writes one TracesData per line; a trace's spans are spread over lines
    lines = [
        doc({"b": [span("b1", "a2", SERVER, 20, 80)]}),
        doc({"a": [span("a2", "a1", CLIENT, 10, 90), span("a1", "", SERVER, 0, 100)]}),
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert detect_format(p) == "otlp"
    assert hops(p) == {(EXTERNAL, "a", 0, 100), ("a", "b", 10, 80)}
    # the same two documents as two files of a directory
    d = tmp_path / "dir"
    d.mkdir()
    for i, x in enumerate(lines):
        write(d, f"{i}.json", x)
    assert hops(d) == {(EXTERNAL, "a", 0, 100), ("a", "b", 10, 80)}


def test_wrapped_client_is_one_hop(tmp_path: Path) -> None:
    # an RPC client span over an HTTP client span, both naming the server: one call a → b
    d = doc(
        {
            "a": [
                span("a1", "", SERVER, 0, 1000),
                span("rpc", "a1", CLIENT, 100, 900, {"server.address": "b", "rpc.system": "grpc"}),
                span("http", "rpc", CLIENT, 110, 890, {"server.address": "b", "http.x": 1}),
            ],
            "b": [span("b1", "http", SERVER, 120, 880)],
        }
    )
    r = load_traces(write(tmp_path, "t.json", d), "otlp", SpanOptions(rate=1.0))
    calls = {(i.caller, i.callee, i.start_us, i.duration_us) for i in r.ecgs[0].invocations}
    assert calls == {(EXTERNAL, "a", 0.0, 1.0), ("a", "b", 0.1, 0.8)}
    assert {i.protocol for i in r.ecgs[0].invocations if i.callee == "b"} == {"grpc"}
    assert r.report.notes[N_NESTED] == 1 and r.report.rows_merged == 2


def test_internal_spans_transparent(tmp_path: Path) -> None:
    d = doc(
        {
            "a": [
                span("a1", "", SERVER, 0, 1000),
                span("i1", "a1", INTERNAL, 10, 990),
                span("i2", "i1", INTERNAL, 20, 980),
                span("c", "i2", CLIENT, 30, 500, {"peer.service": "b"}),
            ],
            "b": [
                span("b1", "c", SERVER, 40, 490),
                span("bi", "b1", INTERNAL, 50, 480),
                span("bc", "bi", CLIENT, 60, 400, {"peer.service": "db"}),
            ],
        }
    )
    assert hops(write(tmp_path, "t.json", d)) == {
        (EXTERNAL, "a", 0, 1000),
        ("a", "b", 30, 470),
        ("b", "db", 60, 340),
    }


def test_producer_consumer_is_asynchronous(tmp_path: Path) -> None:
    # the consumer runs after the producer (and the request) ended: not clock skew, and the
    # producer's caller does not wait for it
    d = doc(
        {
            "a": [
                span("a1", "", SERVER, 0, 1000),
                span("p", "a1", PRODUCER, 100, 200, {"messaging.message.body.size": 64}),
            ],
            "q": [
                span("c", "p", CONSUMER, 5_000, 9_000),
                span("qc", "c", CLIENT, 6_000, 7_000, {"peer.service": "db"}),
            ],
        }
    )
    r = load_traces(write(tmp_path, "t.json", d), "otlp", SpanOptions(rate=1.0))
    e = r.ecgs[0]
    by = {i.callee: i for i in e.invocations}
    assert by["q"].caller == "a" and by["q"].parent is None  # a root of its own
    assert (by["q"].start_us, by["q"].duration_us) == (5.0, 4.0)
    assert by["q"].request_bytes == 64
    assert by["db"].parent == by["q"].id and by["db"].caller == "q"
    assert e.meta["asynchronous"] == [by["q"].id]
    assert r.report.notes[N_ASYNC] == 1
    assert not any("clamped" in k for k in r.report.notes)


def test_grpc_sizes_from_message_events(tmp_path: Path) -> None:
    def ev(typ: str, size: int) -> dict[str, Any]:
        return {
            "name": "message",
            "attributes": [kv("rpc.message.type", typ), kv("rpc.message.uncompressed_size", size)],
        }

    d = doc(
        {
            "a": [
                span("a1", "", SERVER, 0, 1000),
                span(
                    "c",
                    "a1",
                    CLIENT,
                    100,
                    900,
                    {"rpc.system": "grpc"},
                    [ev("SENT", 700), ev("RECEIVED", 3000)],
                ),
            ],
            "b": [span("b1", "c", SERVER, 110, 890, {}, [ev("RECEIVED", 700), ev("SENT", 3000)])],
        }
    )
    r = load_traces(write(tmp_path, "t.json", d), "otlp", SpanOptions(rate=1.0))
    call = next(i for i in r.ecgs[0].invocations if i.callee == "b")
    assert (call.request_bytes, call.response_bytes, call.protocol) == (700, 3000, "grpc")


def test_drop_report_counts_every_span(tmp_path: Path) -> None:
    d = doc(
        {
            "a": [
                span("a1", "", SERVER, 0, 1000),
                span("lost", "a1", CLIENT, 10, 20),  # nobody answers, no peer name
                span("i", "a1", INTERNAL, 30, 40),
                span("orphan", "gone", SERVER, 50, 60),  # parent never exported
            ],
            "b": [span("b1", "", INTERNAL, 0, 5, tid="f" * 32)],  # a trace without calls
        }
    )
    r = load_traces(write(tmp_path, "t.json", d), "otlp", SpanOptions(rate=1.0))
    rep = r.report
    assert rep.rows_read == 5 and rep.rows_used == 2
    assert rep.dropped_rows[R_UNANSWERED] == 1
    assert rep.notes["parent span missing: taken as a root"] == 1
    assert rep.graphs_seen == 2 and rep.graphs_kept == 1
    accounted = (
        rep.rows_used
        + rep.rows_merged
        + rep.notes["internal spans walked through"]
        + sum(rep.dropped_rows.values())
    )
    assert accounted == rep.rows_read


def test_skew_beyond_bound_drops_the_trace(tmp_path: Path) -> None:
    d = doc(
        {
            "a": [
                span("a1", "", SERVER, 0, 1000),
                span("c", "a1", CLIENT, 100, 900, {"peer.service": "b"}),
            ],
            "b": [
                span("b1", "c", SERVER, 110, 890),
                # b's clock is 50 ms ahead for this span
                span("bc", "b1", CLIENT, 50_000_000, 50_000_500, {"peer.service": "db"}),
            ],
        }
    )
    p = write(tmp_path, "t.json", d)
    r = load_traces(p, "otlp", SpanOptions(rate=1.0, max_skew_us=10_000))
    assert r.batch.n_graphs == 0 and r.report.dropped_graphs[g_skew(10_000)] == 1
    # within a larger bound it is clamped into the caller's interval
    r = load_traces(p, "otlp", SpanOptions(rate=1.0, max_skew_us=100_000))
    assert r.batch.n_graphs == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_batches_give_the_same_graphs(tmp_path: Path, workers: int) -> None:
    d = tmp_path / "many"
    d.mkdir()
    base = json.loads((FIX / "trace.jaeger.json").read_text())
    for k in range(70):  # more than _MANY_FILES: tasks by file count
        t = json.loads(json.dumps(base))
        for s in t["data"][0]["spans"]:
            s["traceID"] = f"{k:032x}"
        t["data"][0]["traceID"] = f"{k:032x}"
        write(d, f"{k:03d}.json", t)
    whole = load_traces(d, "jaeger", SpanOptions(rate=5.0))
    rep = ImportReport("x", "jaeger")
    parts = list(
        iter_batches(d, "jaeger", SpanOptions(rate=5.0, batch_spans=30, workers=workers), rep)
    )
    assert len(parts) > 2
    assert sum(p.batch.n_graphs for p in parts) == whole.batch.n_graphs == 70
    assert rep.rows_used == whole.report.rows_used
    one = whole.ecgs[0]
    assert all(e.invocations == one.invocations for e in whole.ecgs)


def test_inputs_directories_globs_gzip_zstd_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zstandard

    raw = (FIX / "trace.otlp.json").read_bytes()
    (tmp_path / "a.json.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "b.json.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    ref = load_traces(FIX / "trace.otlp.json").ecgs[0].invocations
    for p in ("a.json.gz", "b.json.zst"):
        assert detect_format(tmp_path / p) == "otlp"
        assert load_traces(tmp_path / p).ecgs[0].invocations == ref
    assert [s.name for s in inputs.expand(str(tmp_path / "*.json.*"))] == [
        str(tmp_path / "a.json.gz"),
        str(tmp_path / "b.json.zst"),
    ]
    # the same trace twice: one graph (duplicate spans are counted, not doubled)
    r = load_traces(tmp_path)
    assert r.batch.n_graphs == 1 and r.report.dropped_rows["duplicate span id (kept the last)"]
    monkeypatch.setattr(inputs, "_STDIN_DATA", [])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(raw))))
    assert detect_format("-") == "otlp"
    assert load_traces("-").ecgs[0].invocations == ref
    with pytest.raises(TraceFormatError, match="no file matches"):
        inputs.expand(str(tmp_path / "*.nothing"))
    with pytest.raises(TraceFormatError, match="no such file"):
        inputs.expand(str(tmp_path / "absent.json"))


BAD_DOCS = [
    ("empty", b"", "empty"),
    ("blank", b"  \n\n ", "empty"),
    ("binary", bytes(range(256)) * 4, ""),
    ("truncated", b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "a"', "JSON"),
    ("wrong type", b'{"resourceSpans": {"a": 1}}', "resourceSpans"),
    ("span not object", b'{"resourceSpans": [{"scopeSpans": [{"spans": [3]}]}]}', "spans[0]"),
    ("NaN", b'{"resourceSpans": [{"scopeSpans": [{"spans": [NaN]}]}]}', "JSON"),
    (
        "huge time",
        b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"a","spanId":"b",'
        b'"startTimeUnixNano":"1' + b"0" * 40 + b'","endTimeUnixNano":"1"}]}]}]}',
        "startTimeUnixNano",
    ),
    (
        "time not a number",
        b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"a","spanId":"b",'
        b'"startTimeUnixNano":"soon","endTimeUnixNano":"1"}]}]}]}',
        "startTimeUnixNano",
    ),
    (
        "float time",
        b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"a","spanId":"b",'
        b'"startTimeUnixNano":1e300,"endTimeUnixNano":1}]}]}]}',
        "startTimeUnixNano",
    ),
    ("deep", b'{"resourceSpans": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", ""),
    (
        "invalid utf-8",
        b'{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", '
        b'"value": {"stringValue": "\xff"}}]}}]}',
        "UTF-8",
    ),
]


@pytest.mark.parametrize("fmt", ["otlp", "jaeger", "zipkin", "otlp-proto"])
@pytest.mark.parametrize(("label", "data", "field"), BAD_DOCS, ids=[b[0] for b in BAD_DOCS])
def test_malformed_inputs_give_clean_errors(
    tmp_path: Path, fmt: str, label: str, data: bytes, field: str
) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(data)
    with pytest.raises(TraceFormatError) as e:
        load_traces(p, fmt)
    assert str(p) in str(e.value)
    if fmt == "otlp":
        assert field in str(e.value)


@pytest.mark.parametrize(
    ("label", "data", "field"),
    [
        ("startTime string", b'{"data":[{"spans":[{"spanID":"a","startTime":"x"}]}]}', "startTime"),
        (
            "negative duration",
            b'{"data":[{"spans":[{"spanID":"a","startTime":1,"duration":-5}]}]}',
            "duration",
        ),
        (
            "tag value list",
            b'{"data":[{"spans":[{"spanID":"a","startTime":1,"tags":[{"key":"k","value":[1]}]}]}]}',
            "tags[0].value",
        ),
        (
            "kind unknown",
            b'{"data":[{"spans":[{"spanID":"a","startTime":1,"tags":'
            b'[{"key":"span.kind","value":"sideways"}]}]}]}',
            "span.kind",
        ),
        ("spans missing", b'{"data":[{"traceID":"a"}]}', "spans"),
    ],
)
def test_jaeger_errors_name_the_field(tmp_path: Path, label: str, data: bytes, field: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(data)
    with pytest.raises(TraceFormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_traces(p, "jaeger")


def test_document_size_bound(tmp_path: Path) -> None:
    p = tmp_path / "big.json"
    p.write_bytes(b'{"resourceSpans": [\n' + b" " * 5000 + b"]}")
    with pytest.raises(TraceFormatError, match="more than 1000 bytes"):
        load_traces(p, "otlp", SpanOptions(max_document_bytes=1000))
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b"{" + b" " * 100_000))
    with pytest.raises(TraceFormatError, match="more than 1000 bytes"):
        load_traces(bomb, "otlp", SpanOptions(max_document_bytes=1000))


@pytest.mark.parametrize("workers", [1, 2])
def test_otlp_traces_spread_over_lines_and_files(tmp_path: Path, workers: int) -> None:
    # every line holds parts of many traces, as an exporter's batches do; traces are whole
    # again after the input ends, whatever the batch size
    def trace_spans(k: int) -> dict[str, list[dict[str, Any]]]:
        tid = f"{k:032x}"
        return {
            "a": [
                span(f"{k}a1", "", SERVER, 0, 1000, tid=tid),
                span(f"{k}c", f"{k}a1", CLIENT, 100, 900, {"peer.service": "b"}, tid=tid),
            ],
            "b": [span(f"{k}b1", f"{k}c", SERVER, 110, 890, tid=tid)],
        }

    d = tmp_path / "otlp"
    d.mkdir()
    for f in range(3):
        lines = []
        for line in range(4):
            by: dict[str, list[dict[str, Any]]] = {}
            for k in range(line, 40, 4):  # each line: every 4th trace, one service per file
                svc = "ab"[f % 2]
                by.setdefault(svc, []).extend(trace_spans(k)[svc] if f < 2 else [])
            lines.append(json.dumps(doc(by)))
        (d / f"{f}.jsonl").write_text("\n".join(lines) + "\n")
    rep = ImportReport("x", "otlp")
    opts = SpanOptions(rate=1.0, batch_spans=7, workers=workers)
    parts = list(iter_batches(d, "otlp", opts, rep))
    assert sum(p.batch.n_graphs for p in parts) == 40 == rep.graphs_kept
    assert all(p.batch.n_invocations == 2 * p.batch.n_graphs for p in parts)
    assert rep.rows_read == 120 and rep.rows_used == 80 and rep.rows_merged == 40


def test_jaeger_api_v3_answers_otlp(tmp_path: Path) -> None:
    # Jaeger's query API v3 answers OTLP wrapped in "result"
    d = json.loads((FIX / "trace.otlp.json").read_text())
    p = write(tmp_path, "v3.json", {"result": d})
    ref = load_traces(FIX / "trace.otlp.json").ecgs[0].invocations
    assert detect_format(p) == "otlp"
    for fmt in ("otlp", "jaeger"):
        assert load_traces(p, fmt).ecgs[0].invocations == ref
