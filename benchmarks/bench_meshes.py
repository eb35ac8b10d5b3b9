"""This machine's Tables I/II of the published mTLS mesh comparison (issue #18): p99 latency,
CPU and memory deltas over no mesh, client and server side, intra- and inter-node, for Envoy
sidecars (with and without mTLS), HAProxy and nginx sidecars, Envoy as per-node L4 proxies
(mTLS between nodes) and as a waypoint on them — next to the published numbers
(``benchmarks/published/mtls-meshes.yaml``).

Every (mesh, placement) gets its own nodes and pods (:mod:`meshtax.testbed.meshes`), so a
proxy's memory is its own traffic's; fortio drives each in turn (rounds, order rotating) over
HTTP/1.1 to a fortio echo answering after ``--delay-ms``, at ``--rate`` requests/s over
``--connections`` connections. Per run: fortio's p50/p90/p99, each proxy's CPU (schedstat)
and RSS (sampled in the middle of the run, connections open). Client side: the client's
sidecar or its node's proxy; server side: the server's sidecar, its node's proxy and the
waypoint (intra-node, the one node proxy is both). Run as root, under the lock:

    flock -w 7200 /run/meshtax-measure.lock .venv/bin/python benchmarks/bench_meshes.py \\
        --out artifacts/meshes [--rate 800 --connections 1600 --delay-ms 200 --duration 20]
    .venv/bin/python benchmarks/bench_meshes.py --report artifacts/meshes/runs.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from meshtax.model.sidecar import Mode
from meshtax.testbed import procfs
from meshtax.testbed.fortio import FortioServer, LoadFailed, LoadSpec, run_spec
from meshtax.testbed.meshes import MESHES, Deployed, Service, deploy
from meshtax.testbed.nodes import NodeNet
from meshtax.testbed.pinning import CLIENT_APART
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem
from meshtax.testbed.tools import tool

PUBLISHED = Path(__file__).parent / "published" / "mtls-meshes.yaml"
PORT = 8080
PLACEMENTS = ("intra", "inter")
SIDES = ("client", "server")


def _sample(deployed: Deployed, at_s: float, into: dict[str, float]) -> threading.Timer:
    """RSS (MiB) of every proxy by side, ``at_s`` seconds from now."""

    def read() -> None:
        for side in SIDES:
            into[side] = sum(procfs.read_rss(p) for p in deployed.pids(side).values()) / 2**20

    t = threading.Timer(at_s, read)
    t.start()
    return t


def run_one(
    deployed: Deployed, place: Any, target: str, a: argparse.Namespace, fortio: Path
) -> dict[str, Any]:
    pids = {s: list(deployed.pids(s).values()) for s in SIDES}
    every = sorted({p for ps in pids.values() for p in ps})
    before = procfs.cpu_ns(every)
    rss: dict[str, float] = {}
    timer = _sample(deployed, a.duration / 2, rss)
    spec = LoadSpec(
        f"http://{target}/echo?delay={a.delay_ms}ms",
        Mode.HTTP,
        a.size,
        a.rate,
        connections=a.connections,
        duration_s=a.duration,
        timeout_s=10.0,
    )
    res = run_spec(spec, RealSystem(), place, fortio)
    timer.join()
    after = procfs.cpu_ns(every)
    cpu = {s: sum(after[p] - before[p] for p in pids[s]) / 1e9 / res.duration_s for s in SIDES}
    # a proxy serving both sides (intra-node) counts once in the total
    total = sum(after[p] - before[p] for p in every) / 1e9 / res.duration_s
    return {
        "p50_s": res.p50_us / 1e6,
        "p90_s": res.p90_us / 1e6,
        "p99_s": res.p99_us / 1e6,
        "avg_s": res.avg_us / 1e6,
        "qps": res.actual_qps,
        "count": res.count,
        "errors": res.errors,
        "cpu_cores": cpu,
        "cpu_cores_total": total,
        "memory_mib": {s: rss.get(s, 0.0) for s in SIDES},
        "roles": {r: sorted(deployed.sides[r]) for r in deployed.proxies},
    }


def measure(a: argparse.Namespace) -> dict[str, Any]:
    fortio = Path(tool("fortio"))
    meshes = [MESHES[m] for m in a.meshes.split(",")]
    pin = CLIENT_APART
    runs: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []  # runs fortio gave up on (errors), by mesh and round
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_before": os.getloadavg(),
        },
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "options": {k: v for k, v in vars(a).items() if k not in ("report",)},
        "pinning": pin.describe(),
        "runs": runs,
        "failed": failed,
    }
    with Testbed(RealSystem(), lock_timeout=a.wait) as tb:
        net = NodeNet(tb)
        work = tb.scratch_dir("meshtax-meshes-")
        beds: dict[tuple[str, str], tuple[Deployed, Any, str]] = {}
        apps: list[FortioServer] = []
        try:
            for k, mesh in enumerate(meshes):
                for where in a.placements.split(","):
                    tag = f"{k}{'a' if where == 'intra' else 'e'}"
                    cn = net.add_node(f"{tag}c")
                    sn = cn if where == "intra" else net.add_node(f"{tag}s")
                    client = net.add_pod(f"c{tag}", cn)
                    server = net.add_pod(f"s{tag}", sn)
                    app = FortioServer(
                        tb.registered,
                        work / f"app-{tag}",
                        host="0.0.0.0",
                        http_port=PORT,
                        grpc_port=None,
                        tcp_port=None,
                        place=server.place(cpus=pin.app),
                        binary=fortio,
                    )
                    app.start()
                    apps.append(app)
                    d = deploy(
                        tb,
                        net,
                        mesh,
                        client,
                        [Service("server", server, PORT)],
                        Mode.HTTP,
                        tb.scratch_dir(f"meshtax-mesh-{tag}-"),  # a file proxy's uid reaches it
                        cpus=pin.sidecars,
                    )
                    beds[mesh.name, where] = (
                        d,
                        client.place(cpus=pin.client),
                        f"{server.ip}:{PORT}",
                    )
            keys = list(beds)
            for r in range(a.rounds):
                order = keys[r % len(keys) :] + keys[: r % len(keys)]
                for key in order:
                    d, place, target = beds[key]
                    warm = argparse.Namespace(**{**vars(a), "duration": min(3.0, a.duration)})
                    which: dict[str, Any] = {"mesh": key[0], "placement": key[1], "round": r}
                    try:
                        if r == 0:
                            run_one(d, place, target, warm, fortio)
                        rec = run_one(d, place, target, a, fortio)
                    except LoadFailed as e:  # recorded; the other meshes still run
                        failed.append({**which, "error": str(e)[-400:]})
                        (out / "runs.json").write_text(json.dumps(doc, indent=1))
                        print(f"round {r} {key[0]:10s} {key[1]}: FAILED {e}"[:300], flush=True)
                        continue
                    rec.update(which, load=os.getloadavg())
                    runs.append(rec)
                    (out / "runs.json").write_text(json.dumps(doc, indent=1))
                    print(
                        f"round {r} {key[0]:10s} {key[1]}: p99 {rec['p99_s'] * 1e3:.1f} ms, "
                        f"cpu {rec['cpu_cores']}, rss {rec['memory_mib']}, qps {rec['qps']:.0f}",
                        flush=True,
                    )
        finally:
            for d, _, _ in beds.values():
                d.stop()
            for app in apps:
                app.stop()
    doc["ended"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    doc["machine"]["loadavg_after"] = os.getloadavg()
    (out / "runs.json").write_text(json.dumps(doc, indent=1))
    return doc


def summarize(doc: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (mesh, placement): median [min, max] over rounds of the p99 delta over the same
    round's baseline, and of each side's CPU and memory."""
    runs = doc["runs"]
    base = {(r["placement"], r["round"]): r for r in runs if r["mesh"] == "baseline"}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key in dict.fromkeys((r["mesh"], r["placement"]) for r in runs):
        rs = [r for r in runs if (r["mesh"], r["placement"]) == key]
        d99 = [
            r["p99_s"] - base[r["placement"], r["round"]]["p99_s"]
            for r in rs
            if (r["placement"], r["round"]) in base
        ]
        out[key] = {
            "p99_s": _stat(d99),
            "p99_abs_s": _stat([r["p99_s"] for r in rs]),
            "qps": _stat([r["qps"] for r in rs]),
            "cpu_total": _stat([r["cpu_cores_total"] for r in rs]),
            "errors": sum(r["errors"] for r in rs),
            **{
                f"{what}_{s}": _stat([r[what][s] for r in rs])
                for what in ("cpu_cores", "memory_mib")
                for s in SIDES
            },
        }
    return out


def _stat(xs: Sequence[float]) -> tuple[float, float, float] | None:
    return (statistics.median(xs), min(xs), max(xs)) if xs else None


def _fmt(x: tuple[float, float, float] | None, scale: float = 1.0, digits: int = 3) -> str:
    if x is None:
        return "–"
    m, lo, hi = (v * scale for v in x)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def report(doc: Mapping[str, Any]) -> str:
    """Markdown: this machine's tables (p99 Δ in ms, CPU in cores and per 1 000 requests/s,
    memory in MiB), then the published ones."""
    s = summarize(doc)
    o = doc["options"]
    lines = []
    for where in PLACEMENTS:
        rows = [(m, v) for (m, p), v in s.items() if p == where]
        if not rows:
            continue
        lines += [
            "",
            f"**This machine, {where}-node** ({o['rate']:g} requests/s offered, "
            f"{o['connections']} connections, {o['delay_ms']} ms server delay; median "
            f"[min, max] of {o['rounds']} rounds)",
            "",
            "| mesh | p99 Δ (ms) | CPU client (cores) | CPU server (cores) | CPU of every proxy "
            "per 1 000 req/s | memory client (MiB) | memory server (MiB) | req/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for mesh, v in rows:
            qps = v["qps"][0] if v["qps"] else 0.0
            both = v["cpu_total"][0] * 1000 / qps if qps and v["cpu_total"] else 0.0
            lines.append(
                f"| {mesh} | {_fmt(v['p99_s'], 1e3, 1)} | {_fmt(v['cpu_cores_client'])} | "
                f"{_fmt(v['cpu_cores_server'])} | {both:.3f} | "
                f"{_fmt(v['memory_mib_client'], digits=1)} | "
                f"{_fmt(v['memory_mib_server'], digits=1)} | {qps:.0f} |"
            )
    for f in doc.get("failed", ()):
        lines.append(
            f"\nfailed: {f['mesh']} {f['placement']}-node, round {f['round']}: {f['error']}"
        )
    pub = yaml.safe_load(PUBLISHED.read_text())
    for where, table in (("intra", "intra_node"), ("inter", "inter_node")):
        lines += [
            "",
            f"**Published, {where}-node** ({pub['workload']['rps']} requests/s, "
            f"{pub['workload']['connections']} connections, {pub['workload']['server_delay_ms']}"
            " ms delay)",
            "",
            "| mesh | p99 Δ (ms) | CPU client | CPU server | CPU client+server per 1 000 req/s "
            "| memory client | memory server |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for mesh, v in pub[table].items():
            c = v["cpu_cores"]
            per_k = (c["client"] + c["server"]) * 1000 / pub["workload"]["rps"]
            lines.append(
                f"| {mesh} | {v['p99_s'] * 1e3:.0f} | {c['client']:.2f} | {c['server']:.2f} | "
                f"{per_k:.3f} | {v['memory_mib']['client']} | {v['memory_mib']['server']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="artifacts/meshes")
    ap.add_argument("--report", help="print the tables of a runs.json, measure nothing")
    ap.add_argument("--meshes", default=",".join(MESHES))
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--rate", type=float, default=800.0)
    ap.add_argument("--connections", type=int, default=1600)
    ap.add_argument("--delay-ms", type=int, default=200)
    ap.add_argument("--size", type=int, default=0, help="request body bytes (0: a GET)")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=float, default=3600.0, help="seconds to wait for the testbed")
    a = ap.parse_args(argv)
    doc = json.loads(Path(a.report).read_text()) if a.report else measure(a)
    print(report(doc), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
