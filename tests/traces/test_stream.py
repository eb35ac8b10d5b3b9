"""Span files → batches: tasks cut from a directory streamed name by name, graphs of a trace
met again in a later batch counted, the same graphs on one worker or two."""

from __future__ import annotations

import gzip
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from meshtax.traces import inputs
from meshtax.traces.api import load_traces
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.report import ImportReport
from meshtax.traces.spans import SpanOptions
from meshtax.traces.stream import (
    Reading,
    _head_size,
    _Seen,
    _several_tasks,
    _tasks,
    _workers,
    iter_batches,
)

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


def _big(n: int) -> dict[str, Any]:
    base = json.loads((FIX / "trace.jaeger.json").read_text())["data"][0]
    traces = []
    for k in range(n):
        tid = f"{k:032x}"
        traces.append(
            {**base, "traceID": tid, "spans": [{**s, "traceID": tid} for s in base["spans"]]}
        )
    return {"data": traces}


@pytest.mark.parametrize("form", ["plain", "pretty", "gzip", "lines"])
def test_a_large_document_is_cut_into_its_traces(tmp_path: Path, form: str) -> None:
    n = 400 if form == "gzip" else 40  # compressed, larger than a task's ~10 kB
    doc = _big(n)
    p = tmp_path / "big.json"
    if form == "lines":  # JSON Lines: documents of 10 traces
        data = [{"data": doc["data"][i : i + 10]} for i in range(0, n, 10)]
        p.write_text("\n".join(json.dumps(d) for d in data) + "\n")
    else:
        text = json.dumps(doc, indent=2 if form == "pretty" else None).encode()
        p.write_bytes(gzip.compress(text) if form == "gzip" else text)
    opts = SpanOptions(rate=5.0, batch_spans=20)  # a budget of ~10 kB: a few traces a task
    tasks = list(_tasks([inputs.Source(str(p))], iter(()), "jaeger", opts))
    assert len(tasks) > 3
    # a plain file's traces go to the workers as byte ranges, others as their bytes
    assert all(bool(t.ranges) == (form in ("plain", "pretty")) for t in tasks)
    assert sum(len(t.ranges) + len(t.raws) for t in tasks) == n
    rep = ImportReport("x", "jaeger")
    parts = list(iter_batches(p, "jaeger", SpanOptions(rate=5.0, batch_spans=20, workers=2), rep))
    whole = load_traces(p, "jaeger", SpanOptions(rate=5.0))
    assert [g for q in parts for g in q.batch.graph_names] == list(whole.batch.graph_names)
    assert rep.rows_used == whole.report.rows_used == n * len(whole.ecgs[0].invocations)


def test_a_large_document_that_is_not_jaeger_says_so(tmp_path: Path) -> None:
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"something": ["x" * 100] * 200}))
    with pytest.raises(TraceFormatError, match="not Jaeger JSON"):
        list(_tasks([inputs.Source(str(p))], iter(()), "jaeger", SpanOptions(batch_spans=20)))


def test_a_reading_reads_before_it_is_iterated_and_close_stops_its_workers(
    tmp_path: Path,
) -> None:
    _files(tmp_path / "d", 200)
    rep = ImportReport("x", "jaeger")
    opts = SpanOptions(rate=5.0, batch_spans=100, workers=2)
    reading = Reading(tmp_path / "d", "jaeger", opts, rep)
    assert len(multiprocessing.active_children()) == _workers(opts) == 2  # forked at construction
    first = reading._queue[0]
    first.result(timeout=30)  # read while nobody iterates
    reading.close()
    assert not multiprocessing.active_children() and rep.graphs_seen == 0  # none taken


def test_a_reading_that_fails_to_start_leaves_no_worker(tmp_path: Path) -> None:
    _files(tmp_path / "d", 3)
    (tmp_path / "d" / "big.json").write_text(json.dumps({"something": ["x" * 100] * 200}))
    with pytest.raises(TraceFormatError, match="not Jaeger JSON"):  # cut while starting
        Reading(tmp_path / "d", "jaeger", SpanOptions(batch_spans=20), ImportReport("", ""))
    assert not multiprocessing.active_children()
