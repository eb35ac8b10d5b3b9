"""Traces written by the official OpenTelemetry Python SDK and its exporters (OTLP JSON, OTLP
JSON Lines file exporter, OTLP protobuf, Zipkin JSON) give exactly the call graph the app
made: every hop, its start and duration to the nanosecond (Zipkin: to its microseconds),
sizes from attributes and gRPC message events, wrapped clients, internal spans, parallel and
sequential calls, and an asynchronous producer/consumer pair.

The "app" runs in-process: one tracer provider per service (its own resource), W3C context
propagated through a carrier dict as over the wire, explicit timestamps so the expected
graph is known to the nanosecond.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import propagate, trace  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind  # noqa: E402

from meshtax.model.ecg import EXTERNAL  # noqa: E402
from meshtax.traces.api import detect_format, load_traces  # noqa: E402
from meshtax.traces.pairing import N_ASYNC  # noqa: E402
from meshtax.traces.spans import SpanOptions  # noqa: E402

T0 = 1_763_000_000_123_456_789  # epoch ns: the last digits do not survive a float


class App:
    """Services with their own tracer providers; every span goes to one in-memory list and
    (optionally) to each service's own exporters."""

    def __init__(self, extra: Any = None) -> None:
        self.memory = InMemorySpanExporter()
        self.providers: dict[str, TracerProvider] = {}
        self.extra = extra

    def tracer(self, service: str) -> trace.Tracer:
        if service not in self.providers:
            p = TracerProvider(resource=Resource.create({"service.name": service}))
            p.add_span_processor(SimpleSpanProcessor(self.memory))
            if self.extra is not None:
                p.add_span_processor(SimpleSpanProcessor(self.extra(service)))
            self.providers[service] = p
        return self.providers[service].get_tracer("meshtax-test")

    @contextmanager
    def span(
        self,
        service: str,
        name: str,
        kind: SpanKind,
        start: int,
        end: int,
        carrier: dict[str, str] | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Iterator[trace.Span]:
        """A span from ``T0 + start`` to ``T0 + end`` ns; a server/consumer span continues the
        context in ``carrier`` (as extracted from request headers)."""
        ctx = propagate.extract(carrier) if carrier is not None else None
        tr = self.tracer(service)
        s = tr.start_span(name, context=ctx, kind=kind, start_time=T0 + start, attributes=attrs)
        with trace.use_span(s, end_on_exit=False):
            yield s
        s.end(end_time=T0 + end)

    def shutdown(self) -> None:
        for p in self.providers.values():
            p.shutdown()


def headers() -> dict[str, str]:
    c: dict[str, str] = {}
    propagate.inject(c)
    return c


def message(span: trace.Span, typ: str, size: int, at: int) -> None:
    span.add_event(
        "message",
        {"rpc.message.type": typ, "rpc.message.id": 1, "rpc.message.uncompressed_size": size},
        timestamp=T0 + at,
    )


def run_app(app: App) -> None:
    """frontend GET /: cart (HTTP) then catalog ∥ payment (gRPC, sizes in message events),
    an RPC client wrapping an HTTP client to inventory, an internal span around the cart
    call, and an order message consumed by a worker after the request ended."""
    with app.span(
        "frontend",
        "GET /",
        SpanKind.SERVER,
        0,
        1_000_000_007,
        attrs={
            "http.request.method": "GET",
            "http.request.body.size": 0,
            "http.response.body.size": 4096,
        },
    ):
        with app.span("frontend", "render", SpanKind.INTERNAL, 1_001, 400_000_003):
            with app.span(
                "frontend",
                "POST /cart",
                SpanKind.CLIENT,
                2_003,
                300_000_011,
                attrs={
                    "http.request.method": "POST",
                    "server.address": "cart",
                    "http.request.body.size": 321,
                    "http.response.body.size": 654,
                },
            ):
                h = headers()
                with app.span(
                    "cart",
                    "POST /cart",
                    SpanKind.SERVER,
                    3_005,
                    299_000_013,
                    h,
                    {"http.request.method": "POST"},
                ):
                    pass
        for name, start, end in (
            ("catalog", 400_001_000, 700_000_001),
            ("payment", 400_002_000, 650_000_003),
        ):
            with app.span(
                "frontend",
                f"{name}/Get",
                SpanKind.CLIENT,
                start,
                end,
                attrs={"rpc.system": "grpc", "server.address": name},
            ) as c:
                message(c, "SENT", 111, start + 10)
                h = headers()
                with app.span(
                    name,
                    f"{name}/Get",
                    SpanKind.SERVER,
                    start + 500,
                    end - 500,
                    h,
                    {"rpc.system": "grpc"},
                ) as s:
                    message(s, "RECEIVED", 111, start + 600)
                    message(s, "SENT", 2222, end - 600)
                message(c, "RECEIVED", 2222, end - 10)
        # an RPC client over an HTTP client, both naming the server: one call
        with app.span(
            "frontend",
            "inventory.Check",
            SpanKind.CLIENT,
            700_100_000,
            900_000_000,
            attrs={"rpc.system": "grpc", "server.address": "inventory"},
        ):
            with app.span(
                "frontend",
                "POST",
                SpanKind.CLIENT,
                700_200_000,
                899_000_000,
                attrs={"server.address": "inventory", "http.request.body.size": 77},
            ):
                h = headers()
                with app.span(
                    "inventory", "POST /check", SpanKind.SERVER, 700_300_000, 898_000_000, h
                ):
                    pass
        with app.span(
            "frontend",
            "orders publish",
            SpanKind.PRODUCER,
            900_100_000,
            900_200_000,
            attrs={"messaging.system": "kafka", "messaging.message.body.size": 512},
        ):
            order = headers()
    # the worker consumes after the request is answered, then calls its database
    with app.span(
        "worker",
        "orders process",
        SpanKind.CONSUMER,
        1_500_000_000,
        1_800_000_000,
        order,
        {"messaging.system": "kafka"},
    ):
        with app.span(
            "worker",
            "INSERT",
            SpanKind.CLIENT,
            1_600_000_000,
            1_700_000_000,
            attrs={"db.system": "postgresql", "peer.service": "orders-db"},
        ):
            pass


# (caller, callee, start ns, duration ns, request bytes, response bytes, protocol, parent callee)
EXPECTED = {
    (EXTERNAL, "frontend", 0, 1_000_000_007, 0.0, 4096.0, "http", None),
    ("frontend", "cart", 2_003, 299_998_008, 321.0, 654.0, "http", "frontend"),
    ("frontend", "catalog", 400_001_000, 299_999_001, 111.0, 2222.0, "grpc", "frontend"),
    ("frontend", "payment", 400_002_000, 249_998_003, 111.0, 2222.0, "grpc", "frontend"),
    ("frontend", "inventory", 700_100_000, 199_900_000, 77.0, 100.0, "grpc", "frontend"),
    ("frontend", "worker", 1_500_000_000, 300_000_000, 512.0, 100.0, "", None),
    ("worker", "orders-db", 1_600_000_000, 100_000_000, 100.0, 100.0, "", "worker"),
}


def calls(path: Path | list[Path], fmt: str, us: bool = False) -> set[tuple[Any, ...]]:
    assert detect_format(path if isinstance(path, Path) else path[0]) == fmt
    r = load_traces(path, fmt, SpanOptions(rate=10.0))
    assert len(r.ecgs) == 1, r.report.summary()
    e = r.ecgs[0]
    by = {i.id: i for i in e.invocations}
    asyn = set(e.meta.get("asynchronous", ()))
    assert {by[i].callee for i in asyn} == {"worker"}
    assert r.report.notes[N_ASYNC] == 1
    unit = 1000 if us else 1
    return {
        (
            i.caller,
            i.callee,
            round(i.start_us * 1000 / unit),
            round(i.duration_us * 1000 / unit),
            i.request_bytes,
            i.response_bytes,
            i.protocol,
            None if i.parent is None else by[i.parent].callee,
        )
        for i in e.invocations
    }


def sdk_spans() -> tuple[ReadableSpan, ...]:
    app = App()
    run_app(app)
    app.shutdown()
    return app.memory.get_finished_spans()


def test_otlp_json_lines_file_exporter(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter

    # one file per process, as each service's exporter writes its own
    app = App(lambda svc: FileSpanExporter(tmp_path / f"{svc}.jsonl"))
    run_app(app)
    app.shutdown()
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 6 and all(len(f.read_text().splitlines()) >= 1 for f in files)
    assert calls(files, "otlp") == EXPECTED
    assert calls([tmp_path], "otlp") == EXPECTED  # the directory


def test_otlp_json_document(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans

    p = tmp_path / "traces.json"
    p.write_text(json.dumps(encode_spans(sdk_spans()).to_dict(), indent=1))
    assert calls(p, "otlp") == EXPECTED


def test_otlp_protobuf(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    p = tmp_path / "traces.pb"
    p.write_bytes(encode_spans(sdk_spans()).SerializeToString())
    assert calls(p, "otlp-proto") == EXPECTED


def test_zipkin_json_exporter(tmp_path: Path) -> None:
    from opentelemetry.exporter.zipkin.json.v2 import JsonV2Encoder
    from opentelemetry.exporter.zipkin.node_endpoint import NodeEndpoint

    spans = sdk_spans()
    by_service: dict[str, list[Any]] = {}  # the encoder is typed for SDK Span: same objects
    for sp in spans:
        by_service.setdefault(str(sp.resource.attributes["service.name"]), []).append(sp)
    out: list[Any] = []
    for svc, ss in by_service.items():
        ep = NodeEndpoint()
        ep.service_name = svc  # as the exporter does from its spans' resource
        out += json.loads(JsonV2Encoder().serialize(ss, ep))
    p = tmp_path / "zipkin.json"
    p.write_text(json.dumps(out))
    # Zipkin carries microseconds, rounded by the exporter: compare at that resolution
    expected = {
        (a, b, (s + 500) // 1000, d, q, r, proto, par) for a, b, s, d, q, r, proto, par in EXPECTED
    }
    got = calls(p, "zipkin", us=True)
    assert {x[:2] + x[4:] for x in got} == {x[:2] + x[4:] for x in expected}
    t0 = (T0 + 500) // 1000
    for a, b, start, d, *_ in EXPECTED:
        start_us = (T0 + start + 500) // 1000 - t0
        match = [x for x in got if x[:2] == (a, b)]
        assert match and match[0][2] == start_us and abs(match[0][3] - d / 1000) <= 1


# ---- the Go SDK: meshapp's own OTLP/JSON-lines files, one per process ----------------------


def test_go_sdk_meshapp_traces(tmp_path: Path) -> None:
    """Online Boutique's index query on loopback (HTTP frontend, gRPC backends, a parallel
    stage): the per-process trace files, read as a directory, give the topology's call graph
    for every request; each hop's start and duration equal its client span's to the
    nanosecond (read back independently with the json module)."""
    import shutil

    from meshtax.model.sidecar import Mode
    from meshtax.testbed.fortio import LoadSpec, run_spec
    from meshtax.testbed.system import RealSystem, free_ports
    from meshtax.testbed.tools import find_tool
    from meshtax.validate import appctl

    binary = Path(__file__).parents[2] / ".tools" / "bin" / "meshapp"
    if not binary.exists():
        if shutil.which("go") is None:
            pytest.skip("meshapp not built and Go not installed")
        binary = appctl.ensure_built(RealSystem())
    found = find_tool("fortio")
    if found is None:
        pytest.skip("fortio not installed (scripts/install.sh puts it in .tools/bin)")
    fortio = Path(found)
    topo = appctl.load_topology("online-boutique")
    query = topo.query("index")
    names = topo.reachable(query)
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    d = appctl.plan(
        topo, "index", workdir=tmp_path, ports=ports, binary=binary, trace_batch_timeout_s=0.2
    )
    with appctl.start(d, appctl.loopback_spawner(RealSystem())) as app:
        assert run_spec(
            LoadSpec(target=d.entry_target, mode=Mode.HTTP, size_bytes=0, qps=0, n=4),
            binary=fortio,
        ).ok
        assert all(c == 0 for c in app.stop().values())  # SIGTERM: spans flushed
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    for f in d.trace_files:
        shutil.copy(f, trace_dir / f.name)
    r = load_traces(trace_dir, "otlp", SpanOptions(rate=1.0))
    assert len(r.ecgs) == 4, r.report.summary()
    want = sorted(
        (caller, c.service, float(c.request_bytes), float(resp))
        for caller, _, c, resp in topo.invocations(query)
    )
    # independent read of every span: id → (kind, start ns, end ns)
    raw: dict[str, tuple[int, int, int]] = {}
    for f in trace_dir.iterdir():
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for sc in rs["scopeSpans"]:
                    for s in sc["spans"]:
                        raw[s["spanId"]] = (
                            s["kind"],
                            int(s["startTimeUnixNano"]),
                            int(s["endTimeUnixNano"]),
                        )
    for e in r.ecgs:
        calls = [i for i in e.invocations if i.caller != EXTERNAL]
        got = sorted((i.caller, i.callee, i.request_bytes, i.response_bytes) for i in calls)
        assert got == want
        by = {i.id: i for i in e.invocations}
        assert all(by[i.parent].callee == i.caller for i in calls if i.parent)
        (root,) = [i for i in e.invocations if i.caller == EXTERNAL]
        t0 = raw[root.id][1]
        for i in e.invocations:
            kind, start, end = raw[i.id]
            assert kind == (2 if i is root else 3)  # the entry server span; else client spans
            assert round(i.start_us * 1000) == start - t0
            assert round(i.duration_us * 1000) == end - start
