"""Span files → batches: tasks cut from a directory streamed name by name, graphs of a trace
met again in a later batch counted, the same graphs on one worker or two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshtax.traces import inputs
from meshtax.traces.report import ImportReport
from meshtax.traces.spans import SpanOptions
from meshtax.traces.stream import _head_size, _Seen, _several_tasks, _tasks, iter_batches

FIX = Path(__file__).parent / "fixtures"
MET_AGAIN = "trace ids met again in a later batch: separate graphs"


def _files(d: Path, n: int, *, copies: int = 1) -> None:
    d.mkdir()
    base = json.loads((FIX / "trace.jaeger.json").read_text())
    for k in range(n):
        t = base["data"][0]
        tid = f"{k:032x}"
        doc = {
            "data": [{**t, "traceID": tid, "spans": [{**s, "traceID": tid} for s in t["spans"]]}]
        }
        for c in range(copies):
            (d / f"{c}-{k:04d}.json").write_text(json.dumps(doc))


def test_tasks_take_the_files_in_order_a_fixed_number_each(tmp_path: Path) -> None:
    _files(tmp_path / "d", 150)
    opts = SpanOptions(batch_spans=200)  # 10 files a task
    sources = inputs.iter_sources(tmp_path / "d")
    head = [next(sources) for _ in range(_head_size(opts))]
    assert len(head) == 65 and _several_tasks(head, opts)
    tasks = list(_tasks(head, sources, "jaeger", opts))
    assert [len(t.files) for t in tasks] == [10] * 15
    assert [f for t in tasks for f in t.files] == [s.name for s in inputs.expand(tmp_path / "d")]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_trace_in_two_batches_is_two_graphs_and_counted(tmp_path: Path, workers: int) -> None:
    _files(tmp_path / "d", 40, copies=2)  # every trace twice, 40 files apart
    rep = ImportReport("x", "jaeger")
    opts = SpanOptions(rate=5.0, batch_spans=100, workers=workers)
    parts = list(iter_batches(tmp_path / "d", "jaeger", opts, rep))
    assert len(parts) > 2 and sum(p.batch.n_graphs for p in parts) == 80
    assert rep.notes[MET_AGAIN] == 40


def test_seen_counts_only_earlier_batches() -> None:
    seen = _Seen()
    assert seen.add(["a", "b", "b"]) == 0  # a batch's own repeats are not "again"
    assert seen.add(["c", "b", "a", "b"]) == 3
    assert seen.add([]) == 0
    assert seen.add(["d", "c"]) == 1
    assert seen.hashes.dtype.itemsize == 8 and seen.hashes.size == 9
