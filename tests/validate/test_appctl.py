"""meshtax.validate.appctl: topology model, deployment plan, start/stop on a fake system, and
the real meshapp on loopback (Bookinfo) with its traces read back by the OTLP importer."""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from meshtax.model.ecg import EXTERNAL
from meshtax.model.sidecar import Mode
from meshtax.testbed.fortio import LoadSpec, run_spec
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import FakeSystem, Placement, Process, RealSystem
from meshtax.testbed.system import free_ports as _free_ports
from meshtax.testbed.tools import find_tool
from meshtax.traces.api import load_traces
from meshtax.traces.spans import Span, read_otlp_json
from meshtax.validate import appctl
from meshtax.validate.appctl import AppError, ServiceLaunch

# ---- topology model -------------------------------------------------------------------------


def test_bundled_topologies_and_queries() -> None:
    assert appctl.bundled_topologies() == (
        "bookinfo",
        "chain",
        "hotel-reservation",
        "media",
        "online-boutique",
        "order-pipeline",
        "search",
        "social-network",
    )
    want = {
        "bookinfo": ["productpage"],
        "chain": ["one", "two", "four", "eight"],
        "online-boutique": ["index", "browse_product", "view_cart"],
        "hotel-reservation": ["user", "search", "reservation"],
        "social-network": ["compose", "home_timeline"],
        "media": ["movie_page", "poster", "compose_review"],
        "search": ["results", "recommend"],
        "order-pipeline": ["checkout", "receipt"],
    }
    for name, queries in want.items():
        assert list(appctl.load_topology(name).queries) == queries


def test_the_experiments_topology_file_loads() -> None:
    """experiments/offpath.yaml is run as a file (BENCHMARKS.md, issue #14): it must stay valid."""
    path = Path(__file__).resolve().parents[2] / "experiments" / "offpath.yaml"
    t = appctl.load_topology(path)
    assert list(t.queries) == ["small", "large", "serial_wait", "parallel_wait"]


@pytest.mark.parametrize(
    ("topo", "query", "services"),
    [
        ("bookinfo", None, ("frontend", "product", "reviews", "ratings", "details")),
        (
            "online-boutique",
            "index",
            ("frontend", "currency", "productcatalog", "cart", "redis-cart", "ad"),
        ),
        (
            "online-boutique",
            "view_cart",
            (
                "frontend",
                "currency",
                "cart",
                "redis-cart",
                "recommendation",
                "productcatalog",
                "shipping",
            ),
        ),
        ("hotel-reservation", "user", ("frontend", "user")),
        (
            "hotel-reservation",
            "search",
            (
                "frontend",
                "search",
                "geo",
                "rate",
                "memcached-rate",
                "reservation",
                "memcached-reserve",
                "profile",
                "memcached-profile",
            ),
        ),
        (
            "hotel-reservation",
            "reservation",
            ("frontend", "user", "reservation", "memcached-reserve", "mongodb-reservation"),
        ),
    ],
)
def test_reachable_services(topo: str, query: str | None, services: tuple[str, ...]) -> None:
    t = appctl.load_topology(topo)
    assert t.reachable(t.query(query)) == services


def test_invocations_and_defaults() -> None:
    t = appctl.load_topology("bookinfo")
    calls = [
        (caller, c.service, c.request_bytes, resp)
        for caller, _, c, resp in t.invocations(t.query())
    ]
    assert calls == [
        ("frontend", "product", 250, 900),
        ("product", "reviews", 200, 500),
        ("reviews", "ratings", 150, 150),
        ("product", "details", 200, 350),
    ]
    prod = t.services["product"].endpoints["product"]
    assert len(prod.stages) == 1 and len(prod.stages[0]) == 2  # Reviews ∥ Details
    assert t.services["details"].protocol == "http"  # defaults.protocol
    assert t.services["details"].endpoints["details"].compute == "spin"
    hr = appctl.load_topology("hotel-reservation")
    assert hr.services["memcached-rate"].role == "db" and hr.services["rate"].role == ""
    assert hr.services["frontend"].protocol == "http" and hr.services["geo"].protocol == "grpc"


def test_topology_errors(tmp_path: Path) -> None:
    with pytest.raises(AppError, match="no topology 'nope'"):
        appctl.load_topology("nope")
    with pytest.raises(AppError, match="no query 'x'"):
        appctl.load_topology("bookinfo").query("x")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\nservices:\n  a: {endpoints: {e: {stages: [{call: z.f}]}}}\n")
    with pytest.raises(AppError, match="calls unknown z.f"):
        appctl.load_topology(bad)


# ---- plan -----------------------------------------------------------------------------------


def _argv_opts(argv: tuple[str, ...]) -> dict[str, list[str]]:
    opts: dict[str, list[str]] = defaultdict(list)
    for k, v in zip(argv[1::2], argv[2::2], strict=False):
        opts[k].append(v)
    return opts


def test_plan_loopback(tmp_path: Path) -> None:
    t = appctl.load_topology("bookinfo")
    d = appctl.plan(t, workdir=tmp_path, ports=7000, binary=Path("/bin/meshapp"), sample=3)
    assert [s.service for s in d.services] == [
        "frontend",
        "product",
        "reviews",
        "ratings",
        "details",
    ]
    assert [s.port for s in d.services] == [7000, 7001, 7002, 7003, 7004]
    assert d.entry_target == "http://127.0.0.1:7000/productpage" and d.entry_mode == "http"
    prod = _argv_opts(d.launch("product").argv)
    assert prod["--listen"] == ["127.0.0.1:7001"]
    assert prod["--peer"] == ["details=http://127.0.0.1:7004", "reviews=http://127.0.0.1:7002"]
    assert prod["--sample"] == ["3"] and prod["--trace-file"] == [
        str(tmp_path / "product.otlp.jsonl")
    ]
    assert "--peer" not in _argv_opts(d.launch("ratings").argv)
    assert d.trace_files[0] == tmp_path / "frontend.otlp.jsonl"


def test_plan_pods_and_protocol_overrides(tmp_path: Path) -> None:
    t = appctl.load_topology("online-boutique")
    names = t.reachable(t.query("index"))
    hosts = {s: f"10.77.0.{i + 2}" for i, s in enumerate(names)}
    d = appctl.plan(
        t,
        "index",
        workdir=tmp_path,
        hosts=hosts,
        ports=8080,
        entry_protocol="grpc",
        backend_protocol="http",
    )
    front = _argv_opts(d.entry.argv)
    assert front["--listen"] == ["0.0.0.0:8080"]  # inside the pod: any address
    assert front["--protocol"] == ["grpc"] and front["--ping-endpoint"] == ["index"]
    assert front["--peer"] == [
        "ad=http://10.77.0.7:8080",
        "cart=http://10.77.0.5:8080",
        "currency=http://10.77.0.3:8080",
        "productcatalog=http://10.77.0.4:8080",
    ]
    assert d.entry_target == "10.77.0.2:8080" and d.entry_mode == "grpc"
    assert _argv_opts(d.launch("cart").argv)["--protocol"] == ["http"]
    with pytest.raises(AppError, match="share an address"):
        appctl.plan(t, "index", workdir=tmp_path, hosts="10.0.0.1", ports={s: 1 for s in names})
    with pytest.raises(AppError, match="no host for service"):
        appctl.plan(t, "index", workdir=tmp_path, hosts={"frontend": "10.0.0.1"})


def test_plan_sample_zero_means_no_trace_file(tmp_path: Path) -> None:
    d = appctl.plan(appctl.load_topology("bookinfo"), workdir=tmp_path, sample=0)
    assert _argv_opts(d.entry.argv)["--trace-file"] == [""]


# ---- start/stop and build on a fake system ----------------------------------------------------


def test_start_spawns_callees_first_and_stops_callers_first(tmp_path: Path) -> None:
    fake = FakeSystem()
    d = appctl.plan(appctl.load_topology("bookinfo"), workdir=tmp_path, binary=Path("/bin/meshapp"))
    app = appctl.start(
        d, appctl.loopback_spawner(fake, Placement(cpus=(1,))), is_ready=lambda s: True
    )
    started = [c[c.index("--service") + 1] for c in fake.calls]
    assert started == ["details", "ratings", "reviews", "product", "frontend"]
    assert all(c[:3] == ("taskset", "-c", "1") for c in fake.calls)
    codes = app.stop()
    assert list(codes) == ["frontend", "product", "reviews", "ratings", "details"]
    assert all(p.returncode is not None for p in fake.processes)
    assert app.stop() == {}  # idempotent


def test_start_reports_a_dead_service_and_stops_the_rest(tmp_path: Path) -> None:
    fake = FakeSystem()
    d = appctl.plan(appctl.load_topology("bookinfo"), workdir=tmp_path, binary=Path("/bin/meshapp"))

    def spawn(launch: ServiceLaunch, log: int) -> Process:
        p = fake.spawn(launch.argv)
        if launch.service == "reviews":
            Path(launch.log_file).write_text("meshapp: listen tcp: address already in use\n")
            p.wait()  # exits at once
        return p

    with pytest.raises(
        AppError, match="reviews exited 0: meshapp: listen tcp: address already in use"
    ):
        appctl.start(d, spawn, is_ready=lambda s: s.service != "reviews", timeout=1.0)
    assert all(p.returncode is not None for p in fake.processes)


def test_build_runs_build_script(tmp_path: Path) -> None:
    fake = FakeSystem()
    out = appctl.build(fake, out=tmp_path / "meshapp")
    assert out == tmp_path / "meshapp"
    assert fake.calls == [("bash", str(appctl.APP_DIR / "build.sh"), str(tmp_path / "meshapp"))]


def test_merge_traces(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"resourceSpans":[{"x":1}]}\n{"resourceSpans":[{"x":2}]}\n')
    b.write_text('{"resourceSpans":[{"x":3}]}\n\n')
    assert appctl.merge_traces([a, b, tmp_path / "missing"]) == {
        "resourceSpans": [{"x": 1}, {"x": 2}, {"x": 3}]
    }
    b.write_text('{"resourceSpans":[{"x":3}')
    with pytest.raises(AppError, match="b.jsonl:1: not JSON"):
        appctl.merge_traces([b])


# ---- the real application on loopback ---------------------------------------------------------


@pytest.fixture(scope="module")
def meshapp() -> Path:
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").is_file():
        pytest.skip("Go is not installed: cannot build meshapp (app/build.sh needs Go >= 1.24)")
    return appctl.ensure_built(RealSystem())


def _fortio() -> Path:
    found = find_tool("fortio")
    if found is None:
        pytest.skip("fortio not installed (scripts/install.sh puts it in .tools/bin)")
    return Path(found)


def _server_spans_by_trace(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        out[s.trace_id].append(s)
    return out


@pytest.mark.parametrize(
    ("backend", "entry", "sample", "requests"), [(None, None, 1, 6), ("grpc", "grpc", 2, 10)]
)
def test_bookinfo_on_loopback_traces(
    meshapp: Path,
    tmp_path: Path,
    backend: appctl.Protocol | None,
    entry: appctl.Protocol | None,
    sample: int,
    requests: int,
) -> None:
    """Drive Bookinfo with fortio (HTTP GET, or gRPC ping at a gRPC frontend); every traced
    request has one SERVER span per service, each the child of its caller's CLIENT span, with
    the topology's sizes; the OTLP importer turns them into the Bookinfo call graph."""
    fortio = _fortio()
    topo = appctl.load_topology("bookinfo")
    names = topo.reachable(topo.query())
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    d = appctl.plan(
        topo,
        workdir=tmp_path,
        ports=ports,
        binary=meshapp,
        sample=sample,
        entry_protocol=entry,
        backend_protocol=backend,
        trace_batch_timeout_s=0.2,
    )
    with appctl.start(d, appctl.loopback_spawner(RealSystem())) as app:
        mode = Mode.GRPC if d.entry_mode == "grpc" else Mode.HTTP
        result = run_spec(
            LoadSpec(target=d.entry_target, mode=mode, size_bytes=0, qps=0, n=requests),
            binary=fortio,
        )
        assert result.ok
        codes = app.stop()
    assert all(c == 0 for c in codes.values()), codes  # SIGTERM → clean exit (spans flushed)
    merged = appctl.write_merged_traces(d.trace_files, tmp_path / "traces.json")
    spans = read_otlp_json(merged)
    traces = _server_spans_by_trace(spans)
    assert len(traces) == requests // sample
    by_id = {s.span_id: s for s in spans}
    expected_size = {
        c.service: (c.request_bytes, resp) for _, _, c, resp in topo.invocations(d.query)
    }
    req_key = {"http": "http.request.body.size", "grpc": "rpc.request.size"}
    resp_key = {"http": "http.response.body.size", "grpc": "rpc.response.size"}
    for tid, tspans in traces.items():
        servers = [s for s in tspans if s.kind == "server"]
        assert sorted(s.service for s in servers) == sorted(names), tid
        for s in servers:
            proto = d.launch(s.service).protocol
            if s.service == d.query.service:
                assert s.parent_id is None  # the entry request comes from fortio
                continue
            client = by_id[s.parent_id or ""]
            assert client.kind == "client" and client.attrs["peer.service"] == s.service
            caller = by_id[client.parent_id or ""]
            assert caller.kind == "server" and caller.service == client.service != s.service
            want_req, want_resp = expected_size[s.service]
            for span in (s, client):
                assert int(span.attrs[req_key[proto]]) == want_req
                assert int(span.attrs[resp_key[proto]]) == want_resp
            assert (
                client.start_us <= s.start_us
                and s.start_us + s.duration_us <= client.start_us + client.duration_us
            )
    imported = load_traces(merged, "otlp")
    ecgs = imported.ecgs
    assert len(ecgs) == requests // sample, imported.report
    # the entry request is fortio's: empty GET, or its ~10-byte PingMessage (echoed, padded)
    edges = sorted(
        (i.caller, i.callee, i.request_bytes if i.caller != EXTERNAL else 0, i.response_bytes)
        for i in ecgs[0].invocations
    )
    entry_resp = topo.services["frontend"].endpoints["productpage"].response_bytes
    assert edges == sorted(
        [
            (EXTERNAL, "frontend", 0, entry_resp),
            ("frontend", "product", 250, 900),
            ("product", "reviews", 200, 500),
            ("product", "details", 200, 350),
            ("reviews", "ratings", 150, 150),
        ]
    )


def test_trace_file_is_otlp_json_lines(meshapp: Path, tmp_path: Path) -> None:
    """Each line of a service's file is a whole OTLP/JSON TracesData with service.name set."""
    fortio = _fortio()
    topo = appctl.load_topology("hotel-reservation")
    names = topo.reachable(topo.query("user"))
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    d = appctl.plan(topo, "user", workdir=tmp_path, ports=ports, binary=meshapp)
    with appctl.start(d, appctl.loopback_spawner(RealSystem())):
        assert run_spec(
            LoadSpec(target=d.entry_target, mode=Mode.HTTP, size_bytes=0, n=3), binary=fortio
        ).ok
    lines = d.launch("user").trace_file.read_text().splitlines()
    assert lines
    kinds = []
    for line in lines:
        doc = json.loads(line)
        (rs,) = doc["resourceSpans"]
        attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
        assert attrs["service.name"] == {"stringValue": "user"}
        for s in rs["scopeSpans"][0]["spans"]:
            kinds.append(s["kind"])
            assert s["name"] == "user/CheckUser"
            assert {"key": "rpc.request.size", "value": {"intValue": "60"}} in s["attributes"]
    assert kinds == [2, 2, 2]


@pytest.mark.root
def test_bookinfo_in_pods(meshapp: Path, tmp_path: Path) -> None:
    """One pod per service on the testbed bridge, fortio in a client pod; every request is
    traced and imported as a whole Bookinfo graph; nothing is left behind."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    fortio = _fortio()
    system = RealSystem()
    topo = appctl.load_topology("bookinfo")
    names = topo.reachable(topo.query())
    with Testbed(system, lock_timeout=30.0) as tb:
        client = tb.add_pod("client")
        pods = {s: tb.add_pod(s) for s in names}
        d = appctl.plan(
            topo,
            workdir=tmp_path,
            hosts={s: p.ip for s, p in pods.items()},
            ports=9080,
            binary=meshapp,
        )
        assert {s.port for s in d.services} == {9080}
        with appctl.start(d, appctl.testbed_spawner(tb, pods)) as app:
            spec = LoadSpec(target=d.entry_target, mode=Mode.HTTP, size_bytes=0, n=20)
            assert run_spec(spec, place=client.place(), binary=fortio).ok
            pids = [p.pid for p in app.processes.values()]
        netns = [p.netns for p in tb.pods.values()]
    imported = load_traces(appctl.write_merged_traces(d.trace_files, tmp_path / "m.json"), "otlp")
    assert len(imported.ecgs) == 20 and all(len(e.invocations) == 5 for e in imported.ecgs)
    listed = system.run(["ip", "netns", "list"]).stdout
    assert not any(n in listed for n in netns)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
