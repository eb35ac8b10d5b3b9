"""Stored profiles of different sidecar proxies side by side (issue #18): per mode, the
closure (components against the directly measured overhead) and what one 100 B request costs
through one sidecar as the profile prices it — latency (request + response crossing) and CPU
per request at a given rate. Prints a Markdown table.

    .venv/bin/python benchmarks/bench_proxies.py --db profiles.db arch-envoy arch-haproxy \
        arch-nginx [--rate 1000]
"""

from __future__ import annotations

import argparse

from meshtax.model.ecg import EXTERNAL, Invocation, Service, to_batch, validate
from meshtax.model.sidecar import SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.store.sqlite import ProfileStore


def per_request(profile_name: str, store: ProfileStore, rate: float) -> list[list[str]]:
    prof = store.get(profile_name)
    rows = []
    for mode, mp in prof.modes.items():
        g = validate(
            "one-hop",
            {"s": Service("s", SidecarConfig(mode))},
            [Invocation("r", EXTERNAL, "s", 100, 100, rate, 0, 1000)],
        )
        p = predict_batch(to_batch([g]), single_profile(prof))
        c = mp.closure
        closure = (
            "-"
            if c is None
            else f"{c.components_us:.1f} vs {c.measured_us:.1f} "
            f"[{c.measured_lo_us:.1f}, {c.measured_hi_us:.1f}] ({c.error:+.0%})"
        )
        rows.append(
            [
                prof.platform.proxy,
                prof.platform.proxy_version,
                mode.value,
                closure,
                f"{float(p.latency_overhead_us[0]):.1f}",
                f"{float(p.cpu_vcpu[0]) / rate * 1e6:.1f}",
            ]
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--db", required=True)
    ap.add_argument("--rate", type=float, default=1000.0, help="requests/s (CPU is rate-priced)")
    a = ap.parse_args()
    store = ProfileStore(a.db)
    head = [
        "proxy",
        "version",
        "mode",
        "closure: components vs measured µs [95 %] (error)",
        "latency per request, 100 B (µs)",
        f"CPU per request, 100 B at {a.rate:g}/s (CPU-µs)",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in a.profiles:
        for r in per_request(name, store, a.rate):
            print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
