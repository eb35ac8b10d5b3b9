"""Traces at columnar speed (issue #16): meshtax end to end against CRISP on the same files.

Generates Jaeger query-API traces of the shape CRISP was compared on (~20 spans per trace:
an entry server span, client/server pairs in sequential and parallel stages, some internal
spans; one file per trace, and merged files), then times, in alternating runs:

- ``meshtax``: ``meshtax predict --traces DIR --rate R --profile reference`` (parse → pair →
  critical path → prediction → the result document, its table written), the CLI a user runs;
- ``meshtax-json``, ``meshtax-csv``: the same writing every graph as JSON or CSV;
- ``meshtax-merged``: the table on the merged files;
- ``meshtax-stream``: the library path batch by batch (import → prediction per batch, each
  graph's overhead kept; no result document): memory flat in the input size;
- ``crisp`` (with ``--crisp PATH``, the ``crisp-trace`` of a CRISP install): CRISP light mode
  on the per-trace directory, ``--parallelism`` as meshtax's workers.

Both tools run as installed: bytecode is written (``PYTHONDONTWRITEBYTECODE`` is dropped from
their environment) and each runs once, untimed, on 200 of the files first, so no timed run
compiles Python or numba's kernel. For every run: wall time, CPU time of the whole process
tree (less sensitive to other work on a shared machine), and the peak memory of the tree (the
sum of its processes' PSS, sampled every 20 ms). Prints one JSON line per size with the
medians, the CRISP/meshtax ratios per alternating pair, the CLI's peak memory per output
(``cli_peak_rss_mb``) and the machine's load average. ``--no-crisp-above N`` leaves CRISP out
above N traces (its memory grows with them).

    /work/quiet-measure.sh .venv/bin/python benchmarks/bench_traces.py \
        --traces 10000 50000 --dir /tmp/meshtax-bench-traces \
        --crisp /work/wt/crisp-build/venv/bin/crisp-trace --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT_SERVICE, ROOT_OP = "frontend", "HTTP GET /api"
EPOCH_US = 1_700_000_000_000_000
# One API's call tree, as CRISP analyses traces of one operation: stages run one after
# another, the calls of a stage in parallel; every call is present with probability 0.87.
TEMPLATE: list[list[tuple[str, list[list[tuple[str, Any]]]]]] = [
    [("auth", [[("userdb", [])]]), ("catalog", [[("cache", [])], [("productdb", [])]])],
    [("cart", [[("redis", [])]])],
    [("recommend", [[("catalog", [])]]), ("ads", [])],
    [("currency", [])],
]


def _trace(rng: random.Random, n: int) -> dict[str, Any]:
    """One Jaeger trace of the template (about 20 spans)."""
    tid = f"{rng.getrandbits(64):016x}{n:016x}"
    spans: list[dict[str, Any]] = []
    procs: dict[str, dict[str, Any]] = {}

    def span(
        svc: str,
        op: str,
        kind: str,
        parent: str | None,
        start: int,
        dur: int,
        extra: list[dict[str, Any]] | None = None,
    ) -> str:
        sid = f"{rng.getrandbits(64):016x}"
        key = f"p-{svc}"
        procs[key] = {
            "serviceName": svc,
            "tags": [{"key": "hostname", "type": "string", "value": f"host-{svc}"}],
        }
        spans.append(
            {
                "traceID": tid,
                "spanID": sid,
                "flags": 1,
                "operationName": op,
                "references": []
                if parent is None
                else [{"refType": "CHILD_OF", "traceID": tid, "spanID": parent}],
                "startTime": start,
                "duration": dur,
                "tags": [{"key": "span.kind", "type": "string", "value": kind}, *(extra or [])],
                "logs": [],
                "processID": key,
                "warnings": None,
            }
        )
        return sid

    def serve(
        svc: str, op: str, parent: str | None, start: int, dur: int, stages: list[Any]
    ) -> None:
        sid = span(
            svc,
            op,
            "server",
            parent,
            start,
            dur,
            [
                {
                    "key": "http.request.body.size",
                    "type": "int64",
                    "value": rng.choice([100, 200, 1000]),
                }
            ],
        )
        t, end = start + rng.randint(5, 20), start + dur - 5
        slot = (end - t) // max(1, len(stages))
        for stage in stages:
            for callee, inner in stage:
                if rng.random() > 0.87:
                    continue
                cdur = max(20, int(slot * rng.uniform(0.5, 0.95)))
                parent_sid = sid
                if rng.random() < 0.05:
                    parent_sid = span(svc, "internal work", "internal", sid, t, cdur + 1)
                csid = span(
                    svc,
                    f"call {callee}",
                    "client",
                    parent_sid,
                    t + 1,
                    cdur - 1,
                    [{"key": "peer.service", "type": "string", "value": callee}],
                )
                serve(callee, f"/{callee}", csid, t + 2, cdur - 3, inner)
            t += slot

    start = EPOCH_US + n * 5000
    serve(ROOT_SERVICE, ROOT_OP, None, start, rng.randint(3000, 9000), TEMPLATE)
    return {"traceID": tid, "spans": spans, "processes": procs, "warnings": None}


def generate(n_traces: int, root: Path, merge: int, seed: int) -> dict[str, Any]:
    """``root/files/<trace>.json`` (one trace each) and ``root/merged/part-<k>.json``."""
    files, merged = root / "files", root / "merged"
    if (root / "done.json").exists():
        return dict(json.loads((root / "done.json").read_text()))
    shutil.rmtree(root, ignore_errors=True)
    files.mkdir(parents=True)
    merged.mkdir()
    rng = random.Random(seed)
    n_spans = 0
    part: list[str] = []
    for n in range(n_traces):
        t = _trace(rng, n)
        n_spans += len(t["spans"])
        text = json.dumps(t, separators=(",", ":"))
        (files / f"{t['traceID']}.json").write_text(
            '{"data":[' + text + '],"total":0,"limit":0,"offset":0,"errors":null}'
        )
        part.append(text)
        if len(part) == merge or n == n_traces - 1:
            (merged / f"part-{n // merge:04d}.json").write_text(
                '{"data":[' + ",".join(part) + '],"total":0,"limit":0,"offset":0,"errors":null}'
            )
            part = []
    info = {"traces": n_traces, "spans": n_spans, "spans_per_trace": n_spans / n_traces}
    (root / "done.json").write_text(json.dumps(info))
    return info


#: the tools' environment: bytecode written and read, as after an install
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _warm_up(files: Path, out: Path, commands: list[list[str]]) -> None:
    """Each command once, untimed, on 200 of ``files`` (copied to ``out/warm``; the command's
    ``{}`` is that directory): bytecode and numba's kernel cached before anything is timed."""
    warm = out / "warm"
    warm.mkdir(parents=True)
    for f in sorted(files.iterdir())[:200]:
        if not f.name.startswith("light-"):
            shutil.copy(f, warm / f.name)
    for cmd in commands:
        timed([str(warm) if a == "{}" else a for a in cmd])


def _tree_rss_kb(pid: int) -> int:
    """Resident memory of a process and all its descendants (kB): the sum of their
    proportional set sizes (a page shared by forked workers counts once)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def timed(cmd: list[str], env: dict[str, str] | None = ENV) -> dict[str, float]:
    """Run ``cmd``; wall seconds, CPU seconds (user + system of the whole process tree: less
    sensitive than wall time to other work on the machine) and the peak memory (MB) of the
    tree."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_kb(p.pid))
            done.wait(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = p.communicate()
    done.set()
    th.join()
    secs = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for descendants included
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.decode()[-3000:]}")
    return {"seconds": secs, "cpu_seconds": cpu, "peak_rss_mb": peak / 1024}


def stream(inp: str, rate: float, workers: int) -> None:
    """The library path, batch by batch: import (parse, pair) → prediction (hop costs,
    critical path) per batch; only each graph's overhead is kept. Prints a summary."""
    import numpy as np

    from meshtax.predict.engine import predict_batch, single_profile
    from meshtax.store.reference import reference_profile
    from meshtax.traces.report import ImportReport
    from meshtax.traces.spans import SpanOptions
    from meshtax.traces.stream import iter_batches

    look = single_profile(reference_profile())
    rep = ImportReport(inp, "jaeger")
    overhead: list[Any] = []
    critical = 0
    for p in iter_batches(inp, "jaeger", SpanOptions(rate=rate, workers=workers), rep):
        bp = predict_batch(p.batch, look)
        overhead.append(bp.latency_overhead_us)
        critical += int(bp.critical.sum())
    o = np.concatenate(overhead)
    print(
        json.dumps(
            {
                "graphs": int(o.size),
                "critical_rows": critical,
                "overhead_us_p50": float(np.percentile(o, 50)),
                "overhead_us_p99": float(np.percentile(o, 99)),
            }
        )
    )


def _meshtax(inp: str, fmt: str, out: Path, rate: float) -> list[str]:
    """``meshtax predict --traces`` as a user runs it, writing ``fmt`` to ``out``."""
    return [sys.executable, "-m", "meshtax.cli", "predict", "--traces", inp] + [
        "--trace-format",
        "jaeger",
        "--rate",
        str(rate),
        "--profile",
        "reference",
        "--format",
        fmt,
        "-o",
        str(out),
    ]


def _crisp(crisp: str, inp: str, out: Path, workers: int) -> list[str]:
    """CRISP light mode on ``inp`` (its results in ``out``, emptied)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return [crisp, "-a", ROOT_OP, "-s", ROOT_SERVICE, "-i", inp, "-o", str(out)] + [
        "--lightMode",
        "--parallelism",
        str(workers),
    ]


def _machine() -> dict[str, Any]:
    """CPU model and count, kernel, Python: what the numbers were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": len(os.sched_getaffinity(0)),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--traces", type=int, nargs="+", default=[10_000, 50_000])
    ap.add_argument("--dir", default="/tmp/meshtax-bench-traces")
    ap.add_argument("--merge", type=int, default=10_000, help="traces per merged file")
    ap.add_argument("--crisp", help="crisp-trace executable of a CRISP install")
    ap.add_argument(
        "--no-crisp-above",
        type=int,
        metavar="N",
        help="run CRISP only at sizes of at most N traces (meshtax's memory at 200k traces)",
    )
    ap.add_argument("--workers", type=int, default=2, help="meshtax workers, CRISP parallelism")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    ap.add_argument("--stream", metavar="DIR", help=argparse.SUPPRESS)  # the library run
    args = ap.parse_args()
    py = sys.executable
    if args.stream:
        stream(args.stream, args.rate, args.workers)
        return
    warmed = False
    for n in args.traces:
        root = Path(args.dir) / str(n)
        info = generate(n, root, args.merge, args.seed)
        out = Path(tempfile.mkdtemp(prefix="bench-traces-"))
        crisp = args.crisp if args.no_crisp_above is None or n <= args.no_crisp_above else None

        stream_run = [py, __file__, "--stream", "{}", "--rate", str(args.rate)]
        stream_run += ["--workers", str(args.workers)]

        def meshtax(inp: str, fmt: str = "table", out: Path = out) -> list[str]:
            return _meshtax(inp, fmt, out / f"prediction.{fmt}", args.rate)

        commands: dict[str, list[str]] = {
            "meshtax": meshtax(str(root / "files")),
            "meshtax-json": meshtax(str(root / "files"), "json"),
            "meshtax-csv": meshtax(str(root / "files"), "csv"),
            "meshtax-merged": meshtax(str(root / "merged")),
            "meshtax-stream": [str(root / "files") if a == "{}" else a for a in stream_run],
        }
        if not warmed:
            _warm_up(root / "files", out, [meshtax("{}"), stream_run])
            if crisp:
                cmd = _crisp(crisp, "{}", out / "crisp", args.workers)
                _warm_up(root / "files", out / "crisp-warm", [cmd])
            warmed = True
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in commands}
        if crisp:
            runs["crisp"] = []
        load = [os.getloadavg()]
        for _ in range(args.repeats):  # alternating: each repeat runs every tool once
            for k, cmd in commands.items():
                runs[k].append(timed(cmd))
            if crisp:
                cmd = _crisp(crisp, str(root / "files"), out / "crisp", args.workers)
                runs["crisp"].append(timed(cmd))
                for f in (root / "files").glob("light-*"):  # light mode writes to its input
                    f.unlink()
            load.append(os.getloadavg())
        shutil.rmtree(out, ignore_errors=True)
        res: dict[str, Any] = {
            "traces": n,
            **info,
            "load_avg": load,
            "machine": _machine(),
            "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        }
        for k, rs in runs.items():
            res[k] = {
                "seconds_median": statistics.median(r["seconds"] for r in rs),
                "cpu_seconds_median": statistics.median(r["cpu_seconds"] for r in rs),
                "seconds": [round(r["seconds"], 3) for r in rs],
                "cpu_seconds": [round(r["cpu_seconds"], 3) for r in rs],
                "peak_rss_mb": [round(r["peak_rss_mb"]) for r in rs],
                "traces_per_s_median": n / statistics.median(r["seconds"] for r in rs),
                "peak_rss_mb_max": max(r["peak_rss_mb"] for r in rs),
            }
        # the CLI a user runs: its peak memory per size (flat from 10k to 200k is the claim)
        res["cli_peak_rss_mb"] = {
            k: res[k]["peak_rss_mb_max"]
            for k in ("meshtax", "meshtax-json", "meshtax-csv", "meshtax-merged")
        }
        if crisp:
            for k in ("meshtax", "meshtax-stream"):
                for what in ("seconds", "cpu_seconds"):
                    ratios = [
                        c[what] / m[what] for c, m in zip(runs["crisp"], runs[k], strict=True)
                    ]
                    res[f"crisp_over_{k}_{what}"] = {
                        "median": statistics.median(ratios),
                        "min": min(ratios),
                        "max": max(ratios),
                        "pairs": [round(r, 2) for r in ratios],
                    }
        print(json.dumps(res), flush=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
