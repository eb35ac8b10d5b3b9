"""Hostile and careless input (issue #15): every input path, mutated, must give a clean error
or a valid result, within 20 s and 1 GiB of RSS; never a traceback.

The default run takes a few hundred cases; ``-m slow`` runs 10 000 (set
``MESHTAX_FUZZ_CASES`` for another count, ``MESHTAX_FUZZ_SEED`` for another corpus, and
``MESHTAX_FUZZ_REPORT=FILE`` to keep every outcome as JSON, ``MESHTAX_FUZZ_JOBS`` for the
number of cases run at once).
"""

from __future__ import annotations

import collections
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.fuzz.corpus import cases
from tests.fuzz.worker import Outcome, Runner

BAD = ("traceback", "hang", "rss", "crash")


def _run(tmp: Path, n: int) -> list[Outcome]:
    """The cases in order, each in a child of one of ``MESHTAX_FUZZ_JOBS`` runners (default:
    one per CPU, at most 4), made one at a time as a runner asks for the next."""
    seed = int(os.environ.get("MESHTAX_FUZZ_SEED", "15"))
    jobs = int(os.environ.get("MESHTAX_FUZZ_JOBS", "0")) or min(4, os.cpu_count() or 1)
    todo = enumerate(cases(tmp, n, seed))
    lock = threading.Lock()

    def work(runner: Runner) -> list[Outcome]:
        done: list[Outcome] = []
        while True:
            with lock:
                nxt = next(todo, None)
            if nxt is None:
                return done
            done.append(runner.run(*nxt))

    runners = [Runner() for _ in range(jobs)]
    try:
        with ThreadPoolExecutor(jobs) as pool:
            parts = list(pool.map(work, runners))
    finally:
        for r in runners:
            r.close()
    out = sorted((o for part in parts for o in part), key=lambda o: o.case)
    path = os.environ.get("MESHTAX_FUZZ_REPORT")
    if path:
        Path(path).write_text(json.dumps([asdict(o) for o in out], indent=1))
    return out


def _summary(out: list[Outcome]) -> str:
    by = collections.Counter((o.target, o.kind) for o in out)
    lines = [f"{t:>9} {k:<9} {n}" for (t, k), n in sorted(by.items())]
    bad = collections.Counter(
        (o.target, o.kind, o.detail.split(": ", 1)[0]) for o in out if o.kind in BAD
    )
    lines += [f"  {n}× {t} {k}: {d}" for (t, k, d), n in bad.most_common(40)]
    return "\n".join(lines)


def _check(out: list[Outcome]) -> None:
    bad = [o for o in out if o.kind in BAD]
    assert not bad, f"{len(bad)} bad outcomes of {len(out)}:\n{_summary(out)}"
    # every input path was exercised, and most cases reached the code behind the parser
    assert {o.target for o in out} >= {
        "ecg",
        "speedup",
        "profile",
        "envoy",
        "k8s",
        "alibaba",
        "traces",
    }
    assert sum(o.kind == "ok" for o in out) > len(out) // 20


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> list[Outcome]:
    n = int(os.environ.get("MESHTAX_FUZZ_CASES", "0")) or 300
    return _run(tmp_path_factory.mktemp("fuzz"), n)


def test_every_input_path_fails_cleanly(default_run: list[Outcome]) -> None:
    print(_summary(default_run))
    _check(default_run)


@pytest.mark.slow
def test_ten_thousand_cases(tmp_path: Path) -> None:
    n = int(os.environ.get("MESHTAX_FUZZ_CASES", "0")) or 10_000
    out = _run(tmp_path, n)
    print(_summary(out))
    _check(out)
    assert len(out) >= min(n, 10_000)
