"""mTLS cost on a sidecar pair: per connection (handshake, TCP) and per message over sizes.

Plaintext and mTLS pairs run side by side in one Envoy (see :mod:`meshtax.profile.tls`);
paired runs alternate. Prints per-connection and per-request differences with 95 % intervals
and the fitted ``tls`` component per crossing; writes JSON to ``--out``.

    .venv/bin/python benchmarks/bench_mtls.py --modes tcp,http --tls 1.3,1.2 --out artifacts/mtls.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.filters import FilterRunOptions
from meshtax.profile.tls import TLS_SIZES, measure_handshake, measure_tls, tls_models
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="tcp,http")
    ap.add_argument("--tls", default="1.3,1.2", help="comma list of TLS versions (1.2, 1.3)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, required=True, help="result JSON")
    a = ap.parse_args(argv)
    opts = FilterRunOptions.quick() if a.quick else FilterRunOptions()
    be = Backends()
    doc: dict[str, object] = {
        "command": " ".join(sys.argv),
        "machine": platform.node(),
        "load_average_start": os.getloadavg(),
    }
    versions = [v.strip() for v in a.tls.split(",")]
    if not set(versions) <= {"1.2", "1.3"}:
        ap.error("--tls: 1.2 and/or 1.3")
    doc["by_version"] = {}
    with Testbed(RealSystem(), lock_timeout=900.0) as tb:
        for version in versions:
            vdoc: dict[str, object] = {}
            doc["by_version"][version] = vdoc  # type: ignore[index]
            hs = measure_handshake(tb, be, opts, version, k=100 if a.quick else 300)
            vdoc["handshake"] = hs.to_dict()
            e = hs.cpu_us
            print(
                f"TLS {version} handshake per connection through the pair: CPU {e.median:.1f} µs "
                f"[{e.lo:.1f}, {e.hi:.1f}], "
                f"latency {hs.latency_us.median:.1f} µs [{hs.latency_us.lo:.1f}, {hs.latency_us.hi:.1f}]"
            )
            for m in a.modes.split(","):
                mode = Mode(m)
                r = measure_tls(tb, be, mode, TLS_SIZES, opts, version)
                cm = tls_models(r)
                vdoc[mode.value] = {**r.to_dict(), "model": cm.to_dict()}
                print(f"\n{mode.value}: per request through the pair, mTLS − plaintext (95 % CI)")
                for s in r.sizes:
                    c, lt = r.cpu_us[s], r.latency_us[s]
                    print(
                        f"  {s:7d} B  CPU {c.median:8.2f} [{c.lo:7.2f},{c.hi:7.2f}] µs "
                        f"({100 * c.median / r.plain_cpu_us[s]:5.1f}% of plaintext)"
                        f"  latency {lt.median:8.2f} [{lt.lo:7.2f},{lt.hi:7.2f}] µs"
                    )
                print(
                    f"  tls component per crossing: CPU {cm.cpu.intercept:.3f} µs + {cm.cpu.slope * 1e3:.4f} µs/KB"
                    f" + {cm.cpu.per_unit:.3f} µs per extra {cm.cpu.split_bytes} B record (R² "
                    f"{cm.cpu.stats.r2 if cm.cpu.stats else None})"
                )
    doc["load_average_end"] = os.getloadavg()
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"\nwritten {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
