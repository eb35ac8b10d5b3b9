"""CPU an idle Envoy sidecar burns (timers, stats flushes): what it adds per request at a rate.

    .venv/bin/python experiments/idle_envoy.py [--seconds 15] [--mode http]

One Envoy (one worker, the profiler's config) on loopback with no traffic; schedstat of all
its threads over the window.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.procfs import schedstat
from meshtax.testbed.system import RealSystem, free_ports


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--mode", default="http", choices=[m.value for m in Mode])
    a = ap.parse_args()
    admin, inbound, outbound = free_ports(3)
    cfg = EnvoyConfig(
        mode=Mode(a.mode),
        admin_port=admin,
        inbound_port=inbound,
        outbound_port=outbound,
        listen_address="127.0.0.1",
        inbound_upstream=("127.0.0.1", 1),
        outbound_upstream=("127.0.0.1", 1),
    )
    with tempfile.TemporaryDirectory() as d, EnvoyProcess(RealSystem(), cfg, Path(d)) as envoy:
        assert envoy.process is not None
        pid = envoy.process.pid
        time.sleep(2)  # past start-up work
        s0, t0 = sum(schedstat(pid).values()), time.monotonic()
        time.sleep(a.seconds)
        s1, t1 = sum(schedstat(pid).values()), time.monotonic()
    cpu = (s1 - s0) / 1e9 / (t1 - t0)
    print(
        f"idle Envoy ({a.mode}): {cpu * 1e3:.3f} ms CPU per second; per request at 100/s: {cpu / 100 * 1e6:.1f} µs, "
        f"at 1000/s: {cpu / 1000 * 1e6:.2f} µs (load average {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
