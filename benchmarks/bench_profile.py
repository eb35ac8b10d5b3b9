"""Closure and run-to-run agreement of two consecutive ``meshtax profile --quick`` runs.

Run as root: ``.venv/bin/python benchmarks/bench_profile.py [--out result.json]``.

Runs ``meshtax profile --quick`` twice into a scratch profile database (falls back to
calling :func:`meshtax.profile.run.run_profile` directly if the CLI has no ``profile``
command yet), then prints, per mode: wall time, measured overhead with its interval, sum of
components, closure error; and per component larger than 5 µs at any quick size, the
relative difference between the two runs (the issue asks for ≤ 15 %). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from meshtax.model.profile import Profile
from meshtax.profile.run import ProfileOptions, run_profile
from meshtax.profile.system import RealSystem
from meshtax.store.sqlite import ProfileStore

AGREE = 0.15
SIGNIFICANT_US = 5.0


def one_run(name: str, db: Path) -> tuple[Profile, float]:
    t0 = time.monotonic()
    exe = Path(sys.executable).with_name("meshtax")
    cmd = [str(exe), "profile", "--quick", "--name", name]
    env = {**os.environ, "MESHTAX_DB": str(db)}
    done = None
    if exe.exists():
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done is None or (done.returncode != 0 and "No such command" in done.stderr):
        print(f"({' '.join(cmd)} unavailable: calling run_profile directly)", file=sys.stderr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # closure is reported below
            prof = run_profile(ProfileOptions(name=name, quick=True), RealSystem(), ProfileStore(db))
        return prof, time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return ProfileStore(db).get(name), time.monotonic() - t0


def latency_at(p: Profile) -> dict[str, dict[str, dict[int, float]]]:
    out: dict[str, dict[str, dict[int, float]]] = {}
    sizes = p.provenance.options.get("sizes", [100, 1024, 4096])
    for mode, mp in p.modes.items():
        out[mode.value] = {
            c.key: {int(s): float(m.latency.predict([s])[0]) for s in sizes}
            for c, m in mp.components.items()
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="meshtax-bench-"))
    try:
        db = scratch / "profiles.db"
        runs = [one_run(f"bench-{i}", db) for i in (1, 2)]
    finally:
        keep = args.out is not None
        shutil.rmtree(scratch, ignore_errors=keep)
    report: dict[str, Any] = {"runs": [], "agreement": {}}
    for prof, wall in runs:
        entry: dict[str, Any] = {"name": prof.name, "wall_s": round(wall, 1), "modes": {}}
        for mode, mp in prof.modes.items():
            c = mp.closure
            assert c is not None
            entry["modes"][mode.value] = {
                "measured_us": round(c.measured_us, 2),
                "measured_ci_us": [round(c.measured_lo_us, 2), round(c.measured_hi_us, 2)],
                "components_us": round(c.components_us, 2),
                "closure_error": round(c.error, 3),
                "closes": c.closes,
                "components_at_100B_us": {
                    k: round(v[100], 2) for k, v in latency_at(prof)[mode.value].items() if 100 in v
                },
            }
        report["runs"].append(entry)
    a, b = (latency_at(p) for p, _ in runs)
    worst = 0.0
    for mkey in a:
        for comp in a[mkey]:
            for size, va in a[mkey][comp].items():
                vb = b.get(mkey, {}).get(comp, {}).get(size)
                if vb is None or max(abs(va), abs(vb)) <= SIGNIFICANT_US:
                    continue
                rel = abs(va - vb) / max(abs(va), abs(vb))
                worst = max(worst, rel)
                report["agreement"][f"{mkey}/{comp}/{size}"] = round(rel, 3)
    report["worst_disagreement"] = round(worst, 3)
    report["agree_within_15pct"] = worst <= AGREE
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
