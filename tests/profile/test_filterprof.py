"""Filter profiling: configs, orchestration against fakes (exact expectations), one real run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.filterprof import (
    BASE,
    GRPC_PING_PAYLOAD,
    Block,
    FilterBackends,
    FilterRunOptions,
    ModeRun,
    MultiEnvoy,
    VariantSamples,
    additivity,
    additivity_components,
    block_additivity,
    block_order,
    combos_for,
    connect_loop,
    differences,
    echo_server,
    filter_models,
    filter_variants,
    free_ports,
    grpc_ping_message,
    measure_connections,
    multi_bootstrap,
    parse_callgrind_total,
    profile_blocks,
    profile_filters,
    resolve_filters,
    run_length,
    steady_per_request,
    total_errors_by_round,
    worker_cpu_ns,
)
from meshtax.testbed.envoy.config import validate_config
from meshtax.testbed.envoy.filters import (
    COMBINATIONS,
    MIXES,
    catalogue,
    component_name,
    filter_config,
)
from meshtax.testbed.fortio import FortioError, LoadResult, LoadSpec, fortio_binary
from meshtax.testbed.system import FakeSystem, RealSystem
from meshtax.traces.envoy_config import classify_filter

# ---- a fake sidecar: per-variant CPU, latency and instructions per request ------------------


@dataclass
class FakeWorld:
    """Ports → variant names; each request of variant v costs cpu[v] µs, lat[v] µs, instr[v]."""

    cpu: Mapping[str, float]
    lat: Mapping[str, float]
    instr: Mapping[str, float]
    fixed_instr: float = 5000.0  # per counted window: must cancel
    port_names: dict[int, str] = field(default_factory=dict)
    cpu_ns: int = 0
    instr_count: float = 0.0
    loads: list[tuple[str, int, int]] = field(default_factory=list)
    drift: float = 0.0  # added to every request's CPU, growing per load: paired runs cancel it

    def load(self, target: str, mode: Mode, size: int, n: int) -> LoadResult:
        port = int(target.rsplit(":", 1)[1])
        name = self.port_names[port]
        self.loads.append((name, size, n))
        self.drift += 0.0
        self.cpu_ns += round((self.cpu[name] + self.drift) * 1000 * n)
        self.instr_count += self.instr[name] * n + self.fixed_instr
        spec = LoadSpec(target, mode, size, n=n)
        return LoadResult(
            spec,
            n,
            0,
            {"200": n},
            0.0,
            0.0,
            0.0,
            self.lat[name],
            0.0,
            0.0,
            {50.0: self.lat[name]},
            1,
            "fake",
        )


class FakeEnvoy:
    def __init__(
        self,
        world: FakeWorld,
        system: Any,
        boot: Mapping[str, Any],
        workdir: Path,
        callgrind: bool = False,
    ) -> None:
        self.world = world
        self.callgrind = callgrind
        self.boot = boot
        self.pid = 4242
        for lst in boot["static_resources"]["listeners"]:
            port = lst["address"]["socket_address"]["port_value"]
            world.port_names[port] = lst["name"][2:]  # "l_<slug>"

    def __enter__(self) -> FakeEnvoy:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def zero(self) -> None:
        self.world.instr_count = 0.0

    def dump(self) -> int:
        got = round(self.world.instr_count)
        self.world.instr_count = 0.0
        return got


@contextmanager
def _no_echo(*a: Any) -> Iterator[None]:
    yield


def _backends(world: FakeWorld, callgrind: bool = True) -> FilterBackends:
    ports = iter(range(30000, 40000))
    return FilterBackends(
        cpu_ns=lambda pid: world.cpu_ns,
        load=world.load,
        # duck-typed stand-in for MultiEnvoy (pid, zero, dump, context manager)
        envoy=lambda system, boot, workdir, callgrind=False: cast(
            MultiEnvoy, FakeEnvoy(world, system, boot, workdir, callgrind)
        ),
        free_ports=lambda k: [next(ports) for _ in range(k)],
        callgrind_available=lambda: callgrind,
        echo=_no_echo,
    )


OPTS = FilterRunOptions(sizes=(100,), rounds=3, n=12, warmup_n=2, cg_warmup=3, cg_n1=10, cg_n2=50)


def _world() -> FakeWorld:
    # the slug of a combination name: cpp, lua_wasm …; single filters keep their names
    cpu = {BASE: 40.0, "fault_injection": 41.0, "rate_limit": 42.0, "tap": 60.0, "cpp": 63.0}
    lat = {BASE: 200.0, "fault_injection": 201.0, "rate_limit": 203.0, "tap": 230.0, "cpp": 234.0}
    instr = {
        BASE: 100_000.0,
        "fault_injection": 102_000.0,
        "rate_limit": 103_000.0,
        "tap": 150_000.0,
        "cpp": 155_000.0,
    }
    return FakeWorld(cpu, lat, instr)


def test_fake_run_differences_models_and_additivity(tmp_path: Path) -> None:
    world = _world()
    comps = ["fault_injection", "rate_limit", "tap"]
    combos = combos_for(Mode.HTTP, comps)
    assert combos == {"cpp": COMBINATIONS["cpp"]}
    run = profile_filters(
        Mode.HTTP,
        comps,
        OPTS,
        FakeSystem(),
        combos=combos,
        backends=_backends(world),
        workdir=tmp_path,
    )
    d = differences(run)[100]
    assert d["fault_injection"].cpu_us.median == pytest.approx(1.0)
    assert d["tap"].cpu_us.median == pytest.approx(20.0)
    assert d["tap"].latency_us.median == pytest.approx(30.0)
    assert d["tap"].cpu_pct == pytest.approx(50.0)
    # fixed per-window instructions cancel in the two-window difference
    assert d["tap"].instructions == pytest.approx(50_000.0)
    assert d["tap"].instructions_pct == pytest.approx(50.0)
    assert d["rate_limit"].cpu_from_instructions_us == pytest.approx(3000 * 40 / 100_000)
    (row,) = additivity(run, combos)
    assert row.predicted_cpu_us == pytest.approx(1 + 2 + 20)
    assert row.measured_cpu_us.median == pytest.approx(23.0)
    assert row.cpu_error == pytest.approx(0.0)
    assert row.predicted_instructions == pytest.approx(55_000.0)
    assert row.instructions_error == pytest.approx(0.0)
    models = filter_models(run)
    assert set(models) == {
        "fault_injection",
        "rate_limit",
        "tap",
    }  # combinations are not components
    # per crossing: instructions × base µs per instruction, halved
    assert float(models["tap"].cpu.predict([100])[0]) == pytest.approx(50_000 * 40 / 100_000 / 2)
    assert float(models["tap"].latency.predict([100])[0]) == pytest.approx(15.0)
    assert "callgrind" in models["tap"].cpu.note
    # every variant sits right next to a base run, in alternating order
    cpu_loads = [n for n, s, k in world.loads if k == OPTS.n]
    assert len(cpu_loads) == 2 * 4 * OPTS.rounds
    assert cpu_loads[:2] == [BASE, "fault_injection"] and cpu_loads[8:10] == ["rate_limit", BASE]


def test_additivity_total_cpu_against_the_chain(tmp_path: Path) -> None:
    """Total = base + Σ increments vs the chain's own CPU; the increment error is far larger
    for the same absolute miss (the reason the done-criterion is on the total)."""
    world = _world()
    world.cpu = {**world.cpu, "cpp": 73.0}  # increment 33 instead of 1 + 2 + 20
    comps = ["fault_injection", "rate_limit", "tap"]
    combos = combos_for(Mode.HTTP, comps)
    run = profile_filters(
        Mode.HTTP,
        comps,
        OPTS,
        FakeSystem(),
        combos=combos,
        backends=_backends(world, False),
        workdir=tmp_path,
    )
    (row,) = additivity(run, combos)
    assert row.base_cpu_us == pytest.approx(40.0)
    assert row.predicted_total_cpu_us == pytest.approx(63.0)
    assert (
        row.measured_total_cpu_us is not None
        and row.measured_total_cpu_us.median == pytest.approx(73.0)
    )
    assert row.total_error == pytest.approx(63 / 73 - 1)
    assert row.increment_error == pytest.approx(23 / 33 - 1)
    assert row.total_error_rounds is not None and row.total_error_rounds.n == OPTS.rounds
    assert row.total_error_rounds.median == pytest.approx(63 / 73 - 1)
    d = row.to_dict()
    assert d["total_error"] == pytest.approx(63 / 73 - 1) and d["increment_error"] == d["cpu_error"]


def test_total_errors_by_round_use_each_rounds_adjacent_base() -> None:
    def vs(cpu: list[float], base: list[float]) -> VariantSamples:
        return VariantSamples(
            cpu_us=cpu, latency_us=[1.0, 1.0], base_cpu_us=base, base_latency_us=[1.0, 1.0]
        )

    by = {
        BASE: vs([40.0, 50.0], []),
        "a": vs([42.0, 51.0], [40.0, 50.0]),
        "b": vs([45.0, 56.0], [40.0, 51.0]),
        "a+b": vs([50.0, 55.0], [41.0, 49.0]),
    }
    # round 0: 41 + 2 + 5 = 48 vs 50; round 1: 49 + 1 + 5 = 55 vs 55
    assert total_errors_by_round(by, "a+b", ["a", "b"]) == pytest.approx([48 / 50 - 1, 0.0])
    run = ModeRun(Mode.HTTP, {100: by})
    (row,) = additivity(run, {"a+b": ("a", "b")})
    assert row.base_cpu_us == pytest.approx(45.0)
    assert row.predicted_cpu_us == pytest.approx(1.5 + 5.0)


def test_run_length_equal_time() -> None:
    eq = FilterRunOptions(n=1000, min_n=100, equal_time=True)
    assert run_length(eq, 200.0, 200.0) == 1000
    assert run_length(eq, 200.0, 150.0) == 1000  # never longer than n
    assert run_length(eq, 200.0, 800.0) == 250
    assert run_length(eq, 200.0, 20_000.0) == 100  # at least min_n
    assert run_length(FilterRunOptions(n=1000), 200.0, 800.0) == 1000  # off by default


def test_equal_time_runs_in_a_fake_run(tmp_path: Path) -> None:
    world = _world()
    opts = FilterRunOptions(
        sizes=(100,), rounds=2, n=40, warmup_n=2, callgrind=False, equal_time=True, min_n=5
    )
    run = profile_filters(
        Mode.HTTP, ["tap"], opts, FakeSystem(), backends=_backends(world, False), workdir=tmp_path
    )
    # tap's mean latency is 230 µs vs base 200: 40 × 200/230 → 35 requests per run
    assert sorted({k for n, s, k in world.loads if n == "tap" and k != 2}) == [35]
    assert differences(run)[100]["tap"].cpu_us.median == pytest.approx(20.0)


def test_additivity_components_are_the_combinations_members() -> None:
    comps = additivity_components()
    assert set(comps) == {c for v in (*COMBINATIONS.values(), *MIXES.values()) for c in v}
    assert len(comps) == len(set(comps)) and "rbac_network_1000" in comps


def test_measure_connections_per_connection_difference(tmp_path: Path) -> None:
    world = _world()
    per_conn = {BASE: 100.0, "rbac_network_1": 101.0, "rbac_network_1000": 160.0}
    seen: list[tuple[str, int, Mode]] = []

    def connect(port: int, k: int, mode: Mode) -> float:
        name = world.port_names[port]
        seen.append((name, k, mode))
        world.cpu_ns += round(per_conn[name] * 1000 * k)
        return {BASE: 300e-6, "rbac_network_1": 300e-6, "rbac_network_1000": 350e-6}[name]

    got = measure_connections(
        Mode.TCP,
        ["rbac_network_1", "rbac_network_1000"],
        OPTS,
        FakeSystem(),
        backends=_backends(world, False),
        connect=connect,
        k=50,
        workdir=tmp_path,
    )
    assert set(got) == {"rbac_network_1", "rbac_network_1000"}
    big = got["rbac_network_1000"]
    assert big.cpu_us.median == pytest.approx(60.0) and big.latency_us.median == pytest.approx(50.0)
    assert big.base_cpu_us == pytest.approx(100.0) and big.cpu_us.n == OPTS.rounds
    assert got["rbac_network_1"].cpu_us.median == pytest.approx(1.0)
    m = big.model()
    assert m.cpu.intercept == pytest.approx(60.0) and m.latency.intercept == pytest.approx(50.0)
    counted = [x for x in seen if x[1] == 50]
    assert len(counted) == 2 * 2 * OPTS.rounds and {x[2] for x in seen} == {Mode.TCP}


def _serve(handler: Any) -> Iterator[int]:
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            with c:
                handler(c)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join()
        srv.close()


def test_connect_loop_speaks_tcp_echo_and_http() -> None:
    def echo(c: Any) -> None:
        c.sendall(c.recv(4096))

    def http(c: Any) -> None:
        c.recv(4096)
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")

    def refuse(c: Any) -> None:
        c.recv(4096)
        c.sendall(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")

    for port in _serve(echo):
        assert connect_loop(port, 3, Mode.TCP) > 0
    for port in _serve(http):
        assert connect_loop(port, 3, Mode.HTTP) > 0
    for port in _serve(refuse):
        with pytest.raises(ConnectionError, match="403"):
            connect_loop(port, 1, Mode.HTTP)


def test_grpc_ping_message_is_fortios_ping() -> None:
    # gRPC prefix (uncompressed, 4-byte length) + PingMessage field 3 (payload, bytes)
    msg = grpc_ping_message()
    assert msg[0] == 0 and int.from_bytes(msg[1:5], "big") == len(msg) - 5
    assert msg[5:] == b"\x1a" + bytes([len(GRPC_PING_PAYLOAD)]) + GRPC_PING_PAYLOAD


def _grpc_server(answer: str) -> Any:
    """A one-call HTTP/2 server (h2, server side) that answers the ping with ``answer``:
    "reset" (RST_STREAM), "trailers" (a trailers-only gRPC error, no DATA), "echo" (a PING,
    then headers, the request's message back and trailers)."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection
    from h2.events import DataReceived, StreamEnded

    def handle(c: Any) -> None:
        conn = H2Connection(H2Configuration(client_side=False))
        conn.initiate_connection()
        c.sendall(conn.data_to_send())
        body, done = b"", False
        while not done:
            chunk = c.recv(65536)
            if not chunk:
                return
            for ev in conn.receive_data(chunk):
                if isinstance(ev, DataReceived):
                    body += ev.data
                elif isinstance(ev, StreamEnded):
                    done = True
            c.sendall(conn.data_to_send())
        assert body == grpc_ping_message()
        if answer == "reset":
            conn.reset_stream(1, 7)
        elif answer == "trailers":
            conn.send_headers(
                1,
                [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "12")],
                end_stream=True,
            )
        else:
            conn.ping(b"12345678")
            conn.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
            conn.send_data(1, body)
            conn.send_headers(1, [("grpc-status", "0")], end_stream=True)
        c.sendall(conn.data_to_send())
        while c.recv(4096):  # until the client closes (after its GOAWAY)
            pass

    return handle


def test_grpc_ping_rejects_a_reset_and_a_missing_payload() -> None:
    for port in _serve(_grpc_server("reset")):
        with pytest.raises(ConnectionError, match="RST_STREAM"):
            connect_loop(port, 1, Mode.GRPC)
    for port in _serve(_grpc_server("trailers")):
        with pytest.raises(ConnectionError, match="without the echoed payload"):
            connect_loop(port, 1, Mode.GRPC)
    for port in _serve(_grpc_server("echo")):
        assert connect_loop(port, 2, Mode.GRPC) > 0


@pytest.mark.root
def test_grpc_connect_loop_against_fortio(tmp_path: Path) -> None:
    """The HTTP/2 call (h2) is one fortio's gRPC ping server answers (payload echoed)."""
    try:
        fortio_binary()
    except FortioError:
        pytest.skip("fortio missing (scripts/install.sh)")
    port = free_ports(1)[0]
    with echo_server(RealSystem(), tmp_path, Mode.GRPC, port):
        assert connect_loop(port, 3, Mode.GRPC) > 0


def test_fake_run_without_callgrind_uses_schedstat(tmp_path: Path) -> None:
    world = _world()
    run = profile_filters(
        Mode.GRPC,
        ["tap"],
        OPTS,
        FakeSystem(),
        backends=_backends(world, callgrind=False),
        workdir=tmp_path,
    )
    assert run.samples[100]["tap"].instructions is None
    m = filter_models(run)["tap"]
    assert float(m.cpu.predict([100])[0]) == pytest.approx(10.0)
    assert "schedstat" in m.cpu.note
    assert all(k != OPTS.cg_n2 for _, _, k in world.loads)


def test_steady_per_request_and_callgrind_parse() -> None:
    assert steady_per_request(1_200_000, 100, 5_200_000, 500) == 10_000
    with pytest.raises(ValueError):
        steady_per_request(1, 10, 2, 10)
    text = "version: 1\nevents: Ir\nsummary: 34686284\n\nfn=x\n1 2\ntotals: 34998797\n"
    assert parse_callgrind_total(text) == 34998797
    assert parse_callgrind_total("events: Ir\nsummary: 12\n") == 12


def test_worker_cpu_ns_reads_worker_threads(tmp_path: Path) -> None:
    for tid, comm, ns in (
        (1, "envoy", 500),
        (2, "wrk:worker_0", 7000),
        (3, "wrk:worker_1", 3000),
        (4, "dog:main", 9),
    ):
        d = tmp_path / "77" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "schedstat").write_text(f"{ns} 0 0\n")
    assert worker_cpu_ns(77, tmp_path) == 10000
    (tmp_path / "77" / "task" / "2" / "comm").write_text("memcheck\n")
    (tmp_path / "77" / "task" / "3" / "comm").write_text("memcheck\n")
    assert worker_cpu_ns(77, tmp_path) == 500 + 7000 + 3000 + 9


def test_resolve_filters() -> None:
    every = [component_name(f, p) for f, p in catalogue()]
    got = resolve_filters("all", [Mode.HTTP, Mode.TCP])
    assert got[Mode.HTTP] == every
    assert got[Mode.TCP] == [
        "rbac_network_1",
        "rbac_network_100",
        "rbac_network_1000",
        "rbac_network_10000",
    ]
    assert resolve_filters(["ip_tagging", "lua", "rbac_http_100"], [Mode.GRPC])[Mode.GRPC] == [
        "ip_tagging_1",
        "ip_tagging_5",
        "ip_tagging_10",
        "lua",
        "rbac_http_100",
    ]
    assert resolve_filters(None, [Mode.HTTP]) == {Mode.HTTP: []}
    with pytest.raises(ValueError, match="unknown filter 'nope'"):
        resolve_filters(["nope"], [Mode.HTTP])


def test_combos_cover_the_paper_and_the_mixes() -> None:
    every = [component_name(f, p) for f, p in catalogue()]
    assert combos_for(Mode.HTTP, every) == {**COMBINATIONS, **MIXES}
    assert combos_for(Mode.TCP, every) == {}


def test_multi_bootstrap_rejects_clashes(tmp_path: Path) -> None:
    vs = filter_variants(Mode.HTTP, ["lua"], [20001, 20002], ("127.0.0.1", 20000), outdir=tmp_path)
    assert [v.name for v in vs] == [BASE, "lua"]
    with pytest.raises(ValueError, match="distinct"):
        multi_bootstrap(vs, 20001)
    boot = multi_bootstrap(vs, 20009)
    names = [c["name"] for c in boot["static_resources"]["clusters"]]
    assert names == ["c_base", "c_lua"]
    routes = [json_route(lst) for lst in boot["static_resources"]["listeners"]]
    assert routes == ["c_base", "c_lua"]


def json_route(listener: Mapping[str, Any]) -> str:
    hcm = listener["filter_chains"][0]["filters"][-1]["typed_config"]
    return str(hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"])


@pytest.mark.parametrize("name,params", catalogue())
def test_profiled_names_match_imported_names(name: str, params: dict[str, Any]) -> None:
    """The config import classifies each generated filter under the very name it is profiled as."""
    comp = component_name(name, params)
    spec = (
        filter_config(name, Mode.HTTP, module=b"\x00asm\x01\x00\x00\x00", **params)
        if name == "wasm"
        else filter_config(name, Mode.HTTP, **params)
    )
    if name == "access_log":
        pytest.skip("access_log lives on the HTTP connection manager, not in the filter list")
    (f,) = spec.http_filters or spec.network_filters
    got = classify_filter(f)
    assert (got.kind, got.name) == ("profiled", comp)


# ---- real ---------------------------------------------------------------------------------

needs_tools = pytest.mark.skipif(
    shutil.which("envoy") is None and not Path(".venv/bin/envoy").exists(),
    reason="Envoy not installed",
)


@pytest.mark.root
def test_all_variants_validate_with_envoy(tmp_path: Path) -> None:
    """Every single filter and combination of both HTTP modes, in one bootstrap, passes
    ``envoy --mode validate``."""
    try:
        from meshtax.testbed.envoy.config import envoy_binary

        envoy_binary()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"Envoy missing: {e}")
    if shutil.which("wat2wasm") is None:
        pytest.skip("wat2wasm (wabt) missing: the wasm filter cannot be built")
    comps = [c for c in resolve_filters("all", [Mode.HTTP])[Mode.HTTP] if not c.endswith("_10000")]
    for mode in (Mode.HTTP, Mode.GRPC):
        combos = {k: v for k, v in combos_for(mode, comps).items()}
        ports = list(range(21001, 21001 + 1 + len(comps) + len(combos)))
        vs = filter_variants(
            mode, comps, ports, ("127.0.0.1", 21000), combos=combos, outdir=tmp_path
        )
        validate_config(multi_bootstrap(vs, 20999))


@pytest.mark.root
def test_real_short_run(tmp_path: Path) -> None:
    """One real run, small: header mutation and tap in HTTP mode against base, with callgrind.
    Instructions are deterministic enough to assert on: tap (a file per request) costs more
    than a header mutation, and both cost something."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind missing")
    opts = FilterRunOptions(rounds=2, n=100, warmup_n=50, cg_warmup=30, cg_n1=30, cg_n2=130)
    run = profile_filters(
        Mode.HTTP, ["header_mutation", "tap"], opts, RealSystem(), workdir=tmp_path
    )
    d = differences(run)[100]
    hm, tap = d["header_mutation"].instructions, d["tap"].instructions
    assert hm is not None and tap is not None
    assert 0 < hm < tap
    assert all(len(s.cpu_us) == 2 for n, s in run.samples[100].items() if n != BASE)
    assert list((tmp_path / "out" / "tap").iterdir()), "tap wrote no files"


@pytest.mark.root
@pytest.mark.parametrize("mode", [Mode.TCP, Mode.HTTP, Mode.GRPC])
def test_real_connections_network_rbac(mode: Mode, tmp_path: Path) -> None:
    """A real Envoy: new connections through a 1000-rule network RBAC listener and through
    base are served (one message each), and the result has one sample per round."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    opts = FilterRunOptions(rounds=2)
    got = measure_connections(
        mode, ["rbac_network_1000"], opts, RealSystem(), k=20, workdir=tmp_path
    )
    m = got["rbac_network_1000"]
    assert m.cpu_us.n == 2 and m.base_cpu_us > 0 and m.base_latency_us > 0


# ---- paired blocks -----------------------------------------------------------------------


def test_block_order_rotates_then_mirrors() -> None:
    assert block_order(["a", "b", "c"], 0) == ["a", "b", "c", "c", "b", "a"]
    assert block_order(["a", "b", "c"], 4) == ["b", "c", "a", "a", "c", "b"]
    assert block_order([], 3) == []


@dataclass
class _Clocked:
    """A FakeWorld whose every load takes 1 s and adds ``step`` µs to every later request."""

    world: FakeWorld
    step: float = 0.0
    now: float = 0.0

    def load(self, target: str, mode: Mode, size: int, n: int) -> LoadResult:
        self.now += 1.0
        self.world.drift += self.step
        return self.world.load(target, mode, size, n)


def _block_backends(c: _Clocked) -> FilterBackends:
    be = _backends(c.world, callgrind=False)
    be.load = c.load
    be.clock = lambda: c.now
    return be


def test_paired_blocks_cancel_linear_drift(tmp_path: Path) -> None:
    c = _Clocked(
        _world(), step=3.0
    )  # 3 µs more per request after every run: large against 1 µs filters
    combos = {"cpp": COMBINATIONS["cpp"]}
    opts = FilterRunOptions(rounds=4, n=12, warmup_n=2, callgrind=False)
    blocks = profile_blocks(
        Mode.HTTP, combos, opts, FakeSystem(), backends=_block_backends(c), workdir=tmp_path
    )
    assert [b.round for b in blocks] == [0, 1, 2, 3]
    # each variant twice per block, mirrored: its mean run sits at the block's centre
    b1 = blocks[1]
    assert list(b1.cpu_us) == ["fault_injection", "rate_limit", "tap", "cpp", BASE]
    assert all(len(v) == 2 for v in b1.cpu_us.values())
    assert b1.chain_us - b1.base_us == pytest.approx(23.0)
    assert b1.predicted_us == pytest.approx(b1.chain_us)
    (row,) = block_additivity(blocks)
    assert row.blocks == 4 and row.error.median == pytest.approx(0.0, abs=1e-12)
    assert row.increment_predicted_us == pytest.approx(
        23.0
    ) and row.increment_measured_us == pytest.approx(23.0)
    # the loads of one block, in order: base f r t cpp cpp t r f base (round 0)
    counted = [n for n, s, k in c.world.loads if k == opts.n]
    assert counted[:10] == [
        BASE,
        "fault_injection",
        "rate_limit",
        "tap",
        "cpp",
        "cpp",
        "tap",
        "rate_limit",
        "fault_injection",
        BASE,
    ]


def test_paired_blocks_error_budget_and_rounds_continue(tmp_path: Path) -> None:
    c = _Clocked(_world())
    c.world.cpu = {**c.world.cpu, "cpp": 70.0}  # increment 30 instead of 23: not additive
    combos = {"cpp": COMBINATIONS["cpp"]}
    opts = FilterRunOptions(rounds=10, n=12, warmup_n=2, callgrind=False)
    # 5 warm-up loads, then 10 loads (10 s) per block: blocks end at 15, 25, 35; a 4th would end at 45
    blocks = profile_blocks(
        Mode.HTTP,
        combos,
        opts,
        FakeSystem(),
        budget_s=35.0,
        first_round=4,
        backends=_block_backends(c),
        workdir=tmp_path,
    )
    assert [b.round for b in blocks] == [4, 5, 6]
    assert list(blocks[0].cpu_us) == [
        "cpp",
        BASE,
        "fault_injection",
        "rate_limit",
        "tap",
    ]  # rotated by 4
    (row,) = block_additivity(blocks)
    assert row.error.median == pytest.approx(63 / 70 - 1)
    assert row.predicted_us.median == pytest.approx(63.0) and row.chain_us.median == pytest.approx(
        70.0
    )
    assert row.base_us.median == pytest.approx(40.0)
    again = [Block.from_dict(b.to_dict()) for b in blocks]
    assert again == blocks


def test_block_error_by_hand() -> None:
    b = Block(
        "a+b",
        ("a", "b"),
        0,
        {BASE: (40.0, 50.0), "a": (46.0, 48.0), "b": (50.0, 52.0), "a+b": (60.0, 64.0)},
    )
    # base 45, a +2, b +6 → 53 vs 62
    assert b.predicted_us == pytest.approx(53.0) and b.error == pytest.approx(53 / 62 - 1)


def test_paired_blocks_pin_envoy_and_app_to_cpu_1(tmp_path: Path) -> None:
    c = _Clocked(_world())
    be = _block_backends(c)
    seen: dict[str, Any] = {}

    def envoy(
        system: Any,
        boot: Mapping[str, Any],
        workdir: Path,
        callgrind: bool = False,
        place: Any = None,
    ) -> MultiEnvoy:
        seen["envoy"] = place
        return cast(MultiEnvoy, FakeEnvoy(c.world, system, boot, workdir, callgrind))

    @contextmanager
    def echo(*a: Any) -> Iterator[None]:
        seen["echo"] = a[4:]
        yield

    be.envoy, be.echo = envoy, echo
    opts = FilterRunOptions(rounds=1, n=12, warmup_n=2, callgrind=False, pin=True)
    profile_blocks(
        Mode.HTTP, {"cpp": COMBINATIONS["cpp"]}, opts, FakeSystem(), backends=be, workdir=tmp_path
    )
    assert seen["envoy"].cpus == (1,) and seen["echo"][0].cpus == (1,)


def test_bench_additivity_merges_chunks_and_reports_every_row() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_additivity.py"
    spec = importlib.util.spec_from_file_location("bench_additivity", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def chunk(start: str, chain: float, rounds: range) -> dict[str, Any]:
        blocks = [
            Block(
                "a+b",
                ("a", "b"),
                r,
                {BASE: (40.0, 40.0), "a": (42.0, 42.0), "b": (45.0, 45.0), "a+b": (chain, chain)},
            )
            for r in rounds
        ]
        c = {
            "utc_start": start,
            "utc_end": start,
            "load_average_start": [1.0, 1.0, 1.0],
            "load_average_end": [2.0, 2.0, 2.0],
        }
        return {
            "kind": "paired-blocks",
            "modes": {"http": {"chunks": [c], "blocks": [b.to_dict() for b in blocks]}},
        }

    merged = bench.merge([chunk("T1", 47.0, range(3)), chunk("T2", 50.0, range(3, 6))])
    assert (
        len(merged["modes"]["http"]["blocks"]) == 6 and len(merged["modes"]["http"]["chunks"]) == 2
    )
    text = bench.report(merged)
    assert "6 blocks in 2 chunks; T1–T1 load 1.00→2.00; T2–T2" in text
    # errors per block: 47/47 − 1 = 0 (×3) and 47/50 − 1 = −6 % (×3); median of 6 = −3 %
    row = next(ln for ln in text.splitlines() if ln.startswith("| a+b |"))
    assert "| 6 | 40 | 47 [47, 47] |" in row and "**-3.0 %** [-6.0, +0.0]" in row
    with pytest.raises(SystemExit):
        bench.merge([{"modes": {}}])
