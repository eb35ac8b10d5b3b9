"""Prototype (issue #17, item 2): Envoy 1.40 and fortio 1.68.2 over Unix domain sockets.

Builds meshtax's own sidecar bootstrap (meshtax.testbed.envoy.config.bootstrap) and moves its
app-facing legs onto Unix sockets: the inbound cluster's endpoint becomes a ``pipe`` (the app's
socket) and the outbound listener listens on a ``pipe``. Validates every mode with
``envoy --mode validate``, then runs Envoy on loopback with fortio servers (one on Unix
sockets, one on TCP) and sends a few low-rate requests through each leg in each mode:

    inbound:  fortio load (TCP) → Envoy :inbound → pipe → fortio echo on a Unix socket
    outbound: fortio load -unix-socket → Envoy pipe listener → TCP → fortio echo on TCP

A functional check, not a measurement (200 requests at 100/s per case).
Run: PYTHONPATH=src python experiments/uds_envoy.py [--keep]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap
from meshtax.testbed.envoy.process import validate_config
from meshtax.testbed.system import RealSystem, free_ports
from meshtax.testbed.tools import tool

FORTIO = tool("fortio")


def uds_bootstrap(cfg: EnvoyConfig, app_sock: str, outbound_sock: str) -> dict[str, Any]:
    """meshtax's bootstrap with the app-facing legs on Unix sockets (the change the profiler
    needs: two addresses; everything else stays)."""
    b = bootstrap(cfg)
    res = b["static_resources"]
    for c in res["clusters"]:
        if c["name"].startswith("inbound"):
            ep = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ep["address"] = {"pipe": {"path": app_sock}}
    for lst in res["listeners"]:
        if lst["name"] == "outbound":
            # mode: the app may run as another uid than the proxy (Istio: 1337)
            lst["address"] = {"pipe": {"path": outbound_sock, "mode": 0o666}}
            # no SO_ORIGINAL_DST on a Unix socket: the destination comes from the cluster
            lst.pop("listener_filters", None)
    return b


def fortio_server(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    # umask 0: Go creates the socket 0777 & ~umask, so a proxy of another uid may connect
    return subprocess.Popen(
        ["sh", "-c", 'umask 0 && exec "$@"', "sh", str(FORTIO), "server", *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def load(mode: Mode, target: str, unix: str | None = None) -> str:
    argv = [str(FORTIO), "load", "-qps", "100", "-n", "200", "-c", "1", "-payload-size", "100"]
    if unix:
        argv += ["-unix-socket", unix]
    if mode is Mode.GRPC:
        argv += ["-grpc", "-ping"]
    out = subprocess.run([*argv, target], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    ok = re.search(r"(Code 200|Ping SERVING|tcp OK) : (\d+)", text)
    errors = re.search(r"Error cases : count (\d+)", text)
    if ok:
        return f"{ok.group(2)} ok" + (f", {errors.group(1)} errors" if errors else "")
    return "FAILED: " + (errors.group(0) if errors else text.strip().splitlines()[-1])


def run_envoy(
    work: Path, mode: Mode, app_sock: str, upstream: int, name: str
) -> tuple[subprocess.Popen[bytes], int, str]:
    """Validate and start one Envoy; returns it, its inbound TCP port and its outbound socket."""
    inbound, outbound_unused, admin = free_ports(3)
    out_sock = str(work / f"envoy-{name}-outbound.sock")
    cfg = EnvoyConfig(
        mode=mode,
        inbound_port=inbound,
        outbound_port=outbound_unused,
        listen_address="127.0.0.1",
        admin_port=admin,
        inbound_upstream=("127.0.0.1", 1),  # replaced by the app's socket
        outbound_upstream=("127.0.0.1", upstream),
    )
    b = uds_bootstrap(cfg, app_sock, out_sock)
    validate_config(b, RealSystem())  # raises with Envoy's message
    path = work / f"envoy-{name}.json"
    path.write_text(json.dumps(b))
    argv = [str(tool("envoy")), "-c", str(path), "--concurrency", "1"]
    argv += ["--disable-hot-restart", "-l", "warn"]
    log = (work / f"envoy-{name}.log").open("wb")
    envoy = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not Path(out_sock).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return envoy, inbound, out_sock


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="meshtax-uds-"))
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, str] = {}
    names = ("http", "grpc", "tcp")
    try:
        socks = {m: str(work / f"{m}.sock") for m in names}
        tcp_ports = dict(zip(names, free_ports(3)))
        for where in ("uds", "tcp"):
            addr = socks if where == "uds" else {m: f"127.0.0.1:{p}" for m, p in tcp_ports.items()}
            args = ["-http-port", addr["http"], "-grpc-port", addr["grpc"]]
            args += ["-tcp-port", addr["tcp"], "-udp-port", "disabled"]
            args += ["-redirect-port", "disabled"]
            procs.append(fortio_server(args, work / f"fortio-{where}.log"))
        time.sleep(1.0)
        local = {Mode.HTTP: "http://localhost/echo", Mode.GRPC: "localhost:1"}
        local[Mode.TCP] = "tcp://localhost:1"
        for mode in Mode:
            envoy, inbound, out_sock = run_envoy(
                work, mode, socks[mode.value], tcp_ports[mode.value], mode.value
            )
            procs.append(envoy)
            results[f"{mode.value} envoy --mode validate"] = "ok"
            host = f"127.0.0.1:{inbound}"
            target = {Mode.HTTP: f"http://{host}/echo", Mode.GRPC: host}
            target[Mode.TCP] = f"tcp://{host}"
            results[f"{mode.value} inbound (TCP in, pipe to app)"] = load(mode, target[mode])
            results[f"{mode.value} outbound (pipe in, TCP out)"] = load(
                mode, local[mode], unix=out_sock
            )
            results[f"{mode.value} pipe listener mode"] = oct(os.stat(out_sock).st_mode & 0o777)
            envoy.terminate()
            envoy.wait(10)
        # the stand-in for a raw TCP client over a Unix socket: HTTP/1.1 through the
        # tcp-mode sidecar, which forwards bytes without parsing them
        envoy, _, out_sock = run_envoy(
            work, Mode.TCP, socks["tcp"], tcp_ports["http"], "tcp-carrying-http"
        )
        procs.append(envoy)
        results["tcp outbound, HTTP/1.1 carried"] = load(Mode.HTTP, local[Mode.HTTP], out_sock)
    finally:
        for p in procs:  # by PID: only what this script started
            if p.poll() is None:
                p.terminate()
                p.wait(10)
    for k, v in results.items():
        print(f"{k:40} {v}")
    if "--keep" in sys.argv:
        print(f"logs and configs: {work}")
    else:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
