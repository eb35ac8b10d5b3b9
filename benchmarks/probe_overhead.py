"""Overhead of the sidecar eBPF probe on a syscall loop (root; prints one JSON object).

One syscall-load child is the probe's target, a second is not (raw_syscalls tracepoints fire
for every process, so untargeted processes pay the filter). Rounds alternate probe off / on in
the same run; each round is the median ns per syscall over batches of 100 write+read pairs on a
pipe. Also reports the probe's own per-call BPF run time from kernel run-time stats.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "profile"))
sys.path.insert(0, str(ROOT / "src"))

from meshtax.testbed.probes import RealProbe  # noqa: E402
from meshtax.testbed.system import RealSystem  # noqa: E402

LOAD = ROOT / "tests" / "testbed" / "syscall_load.py"


class Child:
    def __init__(self) -> None:
        self.p = subprocess.Popen(
            [sys.executable, str(LOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.p.stdout is not None and self.p.stdout.readline().strip() == "ready"

    def pipe(self, n: int) -> float:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(f"pipe {n}\n")
        self.p.stdin.flush()
        return float(self.p.stdout.readline().split()[1])

    def close(self) -> None:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.close()
        self.p.wait(5)
        self.p.stdout.close()


def main(rounds: int = 8, n: int = 5000) -> None:
    target, other = Child(), Child()
    res: dict[str, list[float]] = {k: [] for k in ("off_t", "on_t", "off_o", "on_o")}
    per_call: list[float] = []
    try:
        for _ in range(rounds):
            res["off_t"].append(target.pipe(n))
            res["off_o"].append(other.pipe(n))
            probe = RealProbe(RealSystem())  # run-time stats off: they cost per event
            probe.start([target.p.pid])
            try:
                res["on_t"].append(target.pipe(n))
                res["on_o"].append(other.pipe(n))
                r = probe.stop()
            finally:
                probe.close()
            assert r.process(target.p.pid).write.count >= n
        # a separate window with run-time stats: the BPF programs' own time per event
        for _ in range(3):
            probe = RealProbe(RealSystem(), run_stats=True)
            probe.start([target.p.pid])
            try:
                target.pipe(n)
                r = probe.stop()
            finally:
                probe.close()
            progs = [p for p in r.programs if p.name in ("sys_enter", "sys_exit")]
            cnt = sum(p.run_cnt for p in progs)
            if cnt:
                per_call.append(sum(p.run_time_ns for p in progs) / cnt)
    finally:
        target.close()
        other.close()
    med = {k: statistics.median(v) for k, v in res.items()}
    print(
        json.dumps(
            {
                "rounds": rounds,
                "pairs_per_round": n,
                "ns_per_syscall_median": {k: round(v, 1) for k, v in med.items()},
                "added_ns_per_syscall_target": round(med["on_t"] - med["off_t"], 1),
                "added_ns_per_syscall_untargeted": round(med["on_o"] - med["off_o"], 1),
                "bpf_ns_per_raw_syscall_event_median": round(statistics.median(per_call), 1)
                if per_call
                else None,
                "raw": res,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
