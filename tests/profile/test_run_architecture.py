"""run_profile in a sidecarless role (node-l4, waypoint) on the node bed, against fakes with
exact expectations: which paths are compared, who the probe watches, how the other proxies'
change counts, the inter-node step and what the profile records; what is refused."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.components import OTHER, READ, TLS, WRITE
from meshtax.model.proxy import ProxyChoice, ProxyError
from meshtax.model.sidecar import Architecture, Mode
from meshtax.profile.backends import Backends
from meshtax.profile.build import ClosureWarning
from meshtax.profile.plan import Plan
from meshtax.profile.run import ProfileOptions, run_profile
from meshtax.testbed.probes import ProbeReading
from meshtax.testbed.system import Completed
from tests.profile.test_decompose import make_reading, thread
from tests.profile.test_run import PIN, EchoFakeSystem, FakePerf, Procs, Sink, fortio_doc

# node a's pods: client .2, server .3; node b's: remote .2 (and the waypoint .3)
LATENCY = {  # µs per request by target
    "10.78.1.3:8080": 140.0,  # intra-node, through node proxy a
    "10.78.1.3:9078": 118.0,  # intra-node, direct
    "10.78.2.2:8080": 200.0,  # inter-node (node-l4) or through the waypoint
    "10.78.2.2:9078": 150.0,  # inter-node, direct
    "10.78.2.2:8081": 170.0,  # the waypoint bed's node-l4 path
}


class NodeWorld:
    def __call__(self, argv: tuple[str, ...]) -> Completed | None:
        if "--version" in argv:
            return Completed(argv, 0, "envoy  version: abc/1.40.0/Clean/RELEASE/BoringSSL\n", "")
        if argv[-1] == "version":
            return Completed(argv, 0, "1.68.2\n", "")
        if "curl" in argv:
            return Completed(argv, 0, "LIVE\n", "")
        if "load" in argv:
            qps = float(argv[argv.index("-qps") + 1])
            avg = LATENCY[argv[-1].rsplit("/", 1)[-1].removeprefix("tcp://")]
            return Completed(argv, 0, fortio_doc(avg, qps if qps > 0 else 4000.0), "")
        return None


class PathProbe:
    """Meshed windows: the watched proxy (first PID) read 2 ms and wrote 4 ms; every other
    proxy on the path read 1 ms more than in the direct windows and spent 2 ms more kernel
    CPU. Per crossing (1000 requests = 2000 crossings): Read 1 + 0.5 per other proxy."""

    def __init__(self) -> None:
        self.started: list[tuple[int, ...]] = []

    def start(self, pids: Sequence[int], follow_netns: str | None = None) -> None:
        self.started.append(tuple(pids))

    def stop(self) -> ProbeReading:
        side, app, *path = self.started[-1]
        meshed = len(self.started) % 2 == 1
        a = thread(8, write=1_000_000, tgid=app)
        others = [
            dataclasses.replace(
                thread(20 + k, read=2_000_000 if meshed else 1_000_000, tgid=p),
                sys_cpu_ns=3_000_000 if meshed else 1_000_000,
            )
            for k, p in enumerate(path)
        ]
        if not meshed:
            return make_reading([a, *others], ipc_ns=0, ipc_count=0)
        w = thread(7, read=2_000_000, write=4_000_000, tgid=side)
        return make_reading([w, a, *others], ipc_ns=0, ipc_count=0)

    def close(self) -> None:
        pass


def _backends(tmp_path: Path, probe: PathProbe) -> Backends:
    clock = iter(range(0, 10**12, 1_000_000))
    return Backends(
        probe=lambda s: probe,
        perf=lambda s: FakePerf([]),
        schedstat=lambda pid: {pid: next(clock)},
        state_dir=tmp_path / "state",
        procs=Procs(),
        envoy_binary=Path("/x/envoy"),
        fortio_binary=Path("/x/fortio"),
        meter=None,
        speed=None,
        now=lambda: dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    )


PLAN = Plan(
    closure_retries=0,
    sizes=(100,),
    rate_fractions=(1.0,),
    latency_run_s=0.1,
    latency_max_runs=3,
    probe_pairs=1,
    pinning=PIN,
    carried=(),
    low_rates=(),
)


def _envoys(sysm: EchoFakeSystem) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for p in sysm.processes:
        if "--config-yaml" in p.argv:
            boot = json.loads(p.argv[list(p.argv).index("--config-yaml") + 1])
            out.append((p.pid, boot))
    return out


def test_node_l4_profile_intra_node_and_the_inter_node_step(tmp_path: Path) -> None:
    sysm = EchoFakeSystem(responders=[NodeWorld()])
    probe, sink = PathProbe(), Sink()
    with pytest.warns(ClosureWarning):  # the fake's components are not its latencies
        prof = run_profile(
            ProfileOptions(name="n", plan=PLAN, architecture=Architecture.NODE_L4, carried=()),
            sysm,
            sink,
            backends=_backends(tmp_path, probe),
        )
    assert prof.platform.architecture == "node-l4" and set(prof.modes) == {Mode.TCP}
    assert sink.saved == [(prof, False)]
    envoys = _envoys(sysm)
    node_a = next(pid for pid, b in envoys if "10.78.1.0" in json.dumps(b))
    # the probe watched node proxy a (the client's and server's node), the app, node proxy b
    assert probe.started[0][0] == node_a and len(probe.started[0]) == 3
    tcp = prof.modes[Mode.TCP]
    c = tcp.closure
    assert c is not None and c.measured_us == pytest.approx((140 - 118) / 2)
    # the idle node proxy b read 1 ms more in meshed windows: 0.5 µs per crossing of Read
    assert tcp.components[READ].latency.intercept == pytest.approx(1.0 + 0.5)
    # inter-node step: ((200 − 150) − 2 · (140 − 118)) / 4 per crossing
    assert tcp.components[TLS].latency.intercept == pytest.approx(1.5)
    assert tcp.tls_version == "1.3"
    rec = prof.provenance.options["internode"]
    assert rec["inter_overhead_us_per_request"]["100"]["median"] == pytest.approx(50.0)
    assert rec["bed"]["servers"] == {"intra": "a", "inter": "b"}
    assert any(
        n.startswith("node-l4: an inter-node crossing adds 1.5 µs") for n in prof.provenance.notes
    )


def test_waypoint_profile_against_the_node_l4_path(tmp_path: Path) -> None:
    sysm = EchoFakeSystem(responders=[NodeWorld()])
    probe = PathProbe()
    with pytest.warns(ClosureWarning):
        prof = run_profile(
            ProfileOptions(
                name="w", plan=replace(PLAN, modes=(Mode.TCP,)), architecture=Architecture.WAYPOINT
            ),
            sysm,
            None,
            backends=_backends(tmp_path, probe),
        )
    assert prof.platform.architecture == "waypoint"
    wp = next(pid for pid, b in _envoys(sysm) if b["node"]["id"] == "meshtax-waypoint")
    side, _app, *path = probe.started[0]
    assert side == wp and len(path) == 2  # both node proxies count as the app does
    tcp = prof.modes[Mode.TCP]
    # waypoint path − node-l4 path of the same pods: (200 − 170) / 2 per crossing
    assert tcp.closure is not None and tcp.closure.measured_us == pytest.approx(15.0)
    assert tcp.components[READ].latency.intercept == pytest.approx(1.0 + 2 * 0.5)
    assert tcp.components[WRITE].latency.intercept == pytest.approx(2.0)
    # their kernel CPU change (2 ms each per 1000 requests: 2 µs per crossing for the two) is
    # in the CPU models' Other, next to the waypoint's own user time (perf 2 ms scaled to
    # schedstat's 1 ms a run: 1/3 µs per crossing at 4000 requests/s over 1 s)
    rec = prof.provenance.options["measurements"]["tcp"][0]
    assert rec["probe"]["path_kernel_cpu_us"] == pytest.approx(2.0)
    other = tcp.components[OTHER].cpu
    assert other.samples is not None and other.samples.values == pytest.approx((2.0 + 1 / 3,))
    assert TLS not in tcp.components  # its mTLS legs are inside its components
    assert "internode" not in prof.provenance.options


class EchoProbe(PathProbe):
    """As :class:`PathProbe`, and the echo app (second PID) spends 4 ms more user and 2 ms more
    kernel CPU in the meshed windows: 2 and 1 µs per crossing."""

    def stop(self) -> ProbeReading:
        r = super().stop()
        if len(self.started) % 2 == 0:  # direct
            return r
        app = self.started[-1][1]
        threads = tuple(
            dataclasses.replace(
                t, user_ns=t.user_ns + 4_000_000, sys_cpu_ns=t.sys_cpu_ns + 2_000_000
            )
            if t.tgid == app
            else t
            for t in r.threads
        )
        return dataclasses.replace(r, threads=threads)


def test_waypoint_records_the_echo_whole_but_prices_its_user_change(tmp_path: Path) -> None:
    """A waypoint's bed records the echo's whole CPU change (user and kernel) per crossing; the
    CPU models count its user change only (the eighth sitting counted it whole and again for
    the caller, 338837d, and a fresh validation measured half that: taken back out)."""
    probe = EchoProbe()
    with pytest.warns(ClosureWarning):
        prof = run_profile(
            ProfileOptions(
                name="w", plan=replace(PLAN, modes=(Mode.TCP,)), architecture=Architecture.WAYPOINT
            ),
            EchoFakeSystem(responders=[NodeWorld()]),
            None,
            backends=_backends(tmp_path, probe),
        )
    rec = prof.provenance.options["measurements"]["tcp"][0]
    assert rec["probe"]["chain_app_cpu_us"] == pytest.approx({"user": 2.0, "kernel": 1.0})
    other = prof.modes[Mode.TCP].components[OTHER].cpu
    # the waypoint's 1/3, the path's kernel 2, the echo's user 2
    assert other.samples is not None
    assert other.samples.values == pytest.approx((1 / 3 + 2.0 + 2.0,))


def test_node_l4_cpu_keeps_the_load_generator_as_caller(tmp_path: Path) -> None:
    """On node-l4's bed the echo's kernel change stays out (its direct path is routed past the
    node proxy) and no caller term is added."""
    with pytest.warns(ClosureWarning):
        prof = run_profile(
            ProfileOptions(name="n", plan=PLAN, architecture=Architecture.NODE_L4, carried=()),
            EchoFakeSystem(responders=[NodeWorld()]),
            None,
            backends=_backends(tmp_path, EchoProbe()),
        )
    rec = prof.provenance.options["measurements"]["tcp"][0]
    assert "chain_app_cpu_us" not in rec["probe"]


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"proxy": ProxyChoice("haproxy")}, "profiles Envoy"),
        ({"modes": (Mode.HTTP,)}, "tcp mode only"),
    ],
)
def test_refused_before_anything_runs(opts: Mapping[str, object], match: str) -> None:
    o = ProfileOptions(architecture=Architecture.NODE_L4, **opts)  # type: ignore[arg-type]
    with pytest.raises(ProxyError, match=match):
        o.resolve_plan()


def test_node_l4_plan_carries_http_and_grpc_as_fully_as_its_mode() -> None:
    p = ProfileOptions(quick=True, architecture=Architecture.NODE_L4).resolve_plan()
    assert p.modes == (Mode.TCP,) and p.carried == ("grpc", "http")
    assert p.carried_all_sizes and p.carried_probe_pairs == p.probe_pairs and not p.capacity
    w = ProfileOptions(quick=True, architecture=Architecture.WAYPOINT).resolve_plan()
    assert w.modes == (Mode.TCP, Mode.HTTP, Mode.GRPC)


class RecordingWorld(NodeWorld):
    def __init__(self) -> None:
        self.loads: list[tuple[str, ...]] = []

    def __call__(self, argv: tuple[str, ...]) -> Completed | None:
        if "load" in argv:
            self.loads.append(argv)
        return super().__call__(argv)


def test_node_l4_inter_node_step_at_the_low_rates(tmp_path: Path) -> None:
    """The inter-node step's CPU is also measured at fixed request rates (the plan's low rates,
    its smallest size, both meshed paths), so the tls CPU model is fitted with a rate term."""
    world = RecordingWorld()
    sysm = EchoFakeSystem(responders=[world])
    plan = replace(PLAN, low_rates=(100.0,), low_rate_run_s=0.1)
    with pytest.warns(ClosureWarning):
        prof = run_profile(
            ProfileOptions(name="n", plan=plan, architecture=Architecture.NODE_L4, carried=()),
            sysm,
            Sink(),
            backends=_backends(tmp_path, PathProbe()),
        )
    fixed = [a for a in world.loads if a[a.index("-qps") + 1] == "100"]
    targets = {a[-1].rsplit("/", 1)[-1].removeprefix("tcp://") for a in fixed}
    # intra- and inter-node meshed paths at 100/s, 4 rounds each, 200 requests a run (2 s)
    assert "10.78.1.3:8080" in targets and "10.78.2.2:8080" in targets
    assert sum("10.78.2.2:8080" in a[-1] for a in fixed) >= 4
    rec = prof.provenance.options["internode"]
    (at,) = rec["tls_cpu_us_per_crossing_at_rate"]
    assert at["size"] == 100 and at["rate"] == 100.0 and len(at["samples"]) == 4
    assert len(rec["closed_loop_rates"]["100"]) == 4
    tls = prof.modes[Mode.TCP].components[TLS].cpu
    # fitted on both: the closed-loop samples at their rates, the fixed-rate ones at theirs
    assert tls.samples is not None and tls.samples.rates is not None
    assert sorted(set(tls.samples.rates)) == sorted(
        {at["achieved"], *rec["closed_loop_rates"]["100"]}
    )
    assert len(tls.samples.rates) == 8
