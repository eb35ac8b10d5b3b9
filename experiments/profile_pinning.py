"""Which CPU placement gives the lowest, most stable latency for client → Envoy → echo?

Run by hand (root not needed; loopback only): ``.venv/bin/python experiments/profile_pinning.py``.
Prints, per placement and mode, the median over repeats of fortio's p50 and p90 (µs) with
and without Envoy, and the spread (max-min of the per-run p50s). Nothing is asserted.
"""

from __future__ import annotations

import argparse

from meshtax.model.sidecar import Mode
from meshtax.model.stats import median
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.fortio import FortioServer, run_load
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.runstate import owned_tempdir
from meshtax.testbed.system import RealSystem

PORTS = {"http": 47380, "grpc": 47379, "tcp": 47378}
SIDECAR_PORT, ADMIN_PORT = 47306, 47300
PLACEMENTS = [
    Pinning(),
    Pinning(client=(0,), sidecars=(1,), app=(1,)),
    Pinning(client=(0,), sidecars=(1,), app=(0,)),
    Pinning(client=(0,), sidecars=(0,), app=(1,)),
    Pinning(client=(0,), sidecars=(0,), app=(0,)),
    Pinning(client=(1,), sidecars=(0,), app=(0,)),
]


def main(modes: list[str], repeats: int = 5, n: int = 3000, size: int = 100) -> None:
    system = RealSystem()
    work = owned_tempdir("pin")
    for pin in PLACEMENTS:
        with FortioServer(
            system,
            work / "srv",
            http_port=PORTS["http"],
            grpc_port=PORTS["grpc"],
            tcp_port=PORTS["tcp"],
            place=pin.place("app"),
        ):
            for mode in modes:
                up = ("127.0.0.1", PORTS[mode])
                cfg = EnvoyConfig(
                    mode=Mode(mode),
                    listen_address="127.0.0.1",
                    inbound_port=SIDECAR_PORT,
                    outbound_port=SIDECAR_PORT + 1,
                    admin_port=ADMIN_PORT,
                    inbound_upstream=up,
                    outbound_upstream=up,
                )
                with EnvoyProcess(system, cfg, work / mode, place=pin.place("sidecars")):
                    p50: dict[str, list[float]] = {"direct": [], "envoy": []}
                    p90: dict[str, list[float]] = {"direct": [], "envoy": []}
                    for _ in range(repeats):
                        for name, port in (("direct", PORTS[mode]), ("envoy", SIDECAR_PORT)):
                            r = run_load(
                                f"127.0.0.1:{port}", mode, size, 0, n=n, place=pin.place("client")
                            )
                            p50[name].append(r.p50_us)
                            p90[name].append(r.p90_us)
                    cells = []
                    for name in ("direct", "envoy"):
                        cells.append(
                            f"{name} p50 {median(p50[name]):6.1f} (spread {max(p50[name]) - min(p50[name]):5.1f})"
                            f" p90 {median(p90[name]):6.1f}"
                        )
                    over = median(p50["envoy"]) - median(p50["direct"])
                    print(
                        f"{pin.describe():34s} {mode:4s} "
                        + " | ".join(cells)
                        + f" | overhead {over:6.1f}",
                        flush=True,
                    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modes", nargs="*", default=["tcp", "http", "grpc"])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    main(a.modes, a.repeats)
