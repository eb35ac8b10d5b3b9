"""Sidecar memory against open connections (M + n·m with R²), per mode, plaintext and mTLS.

A thin driver of :func:`meshtax.profile.memory.measure_memory` (every mode, plaintext and
mTLS); prints the server sidecar's
model per mode and TLS setting, writes every point as JSON (``--out``).

    .venv/bin/python benchmarks/bench_memory.py --modes tcp,http,grpc --out artifacts/memory.json
    .venv/bin/python benchmarks/bench_memory.py --quick
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
from meshtax.profile.memory import CONNECTIONS, QUICK_CONNECTIONS, MemorySpec, measure_memory
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="tcp,http,grpc")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tls", default="1.3", choices=("1.2", "1.3"))
    ap.add_argument("--out", type=Path, required=True, help="result JSON")
    a = ap.parse_args(argv)
    conns = QUICK_CONNECTIONS if a.quick else CONNECTIONS
    doc: dict[str, object] = {
        "command": " ".join(sys.argv),
        "machine": platform.node(),
        "load_average_start": os.getloadavg(),
    }
    with Testbed(RealSystem(), lock_timeout=900.0) as tb:
        results = [
            measure_memory(tb, Backends(), MemorySpec(Mode(m), mtls, conns, a.tls))
            for m in a.modes.split(",")
            for mtls in (False, True)
        ]
    doc["results"] = [r.to_dict() for r in results]
    print(f"{'mode':6s} {'mTLS':5s} {'role':7s} {'M (MiB)':>9s} {'m (KiB/conn)':>13s} {'R²':>7s}")
    for r in results:
        for role in ("server", "client"):
            r2 = r.r2(role)
            print(
                f"{r.spec.mode.value:6s} {str(r.spec.mtls):5s} {role:7s} {r.base_bytes(role) / 2**20:9.2f} "
                f"{r.per_connection_bytes(role) / 1024:13.2f} {r2 if r2 is not None else float('nan'):7.4f}"
            )
    doc["load_average_end"] = os.getloadavg()
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"\nwritten {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
