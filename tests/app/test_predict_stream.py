"""``predict --traces`` batch by batch: the same document as one batch over every graph,
graph by graph and exactly, in several batches, with per-graph numbers held as columns."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshtax.app.data import write_examples
from meshtax.app.predict import PredictOptions, predict_files
from meshtax.app.pricing import load_batch
from meshtax.predict.architecture import predict_architecture
from meshtax.report import result
from meshtax.report.exporters import EXPORTERS
from meshtax.report.result import MAX_DETAILED_GRAPHS, GraphList, prediction_document
from meshtax.report.tables import prediction_distributions
from meshtax.report.text import prediction_text
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host

CALLS = {"frontend": ["auth", "catalog", "cart"], "catalog": ["db"], "cart": ["redis"]}


def _trace(rng: random.Random, t: int) -> dict[str, Any]:
    """Trace ``t``: frontend calls its callees one after another or in parallel, each call
    present with probability 0.8, sizes and times at random."""
    tid = f"{t + 1:032x}"
    spans: list[dict[str, Any]] = []

    def span(svc: str, kind: str, parent: str | None, start: int, dur: int) -> str:
        sid = f"{len(spans) + 1:08x}{t:08x}"
        size = rng.choice([100, 700, 3000])
        spans.append(
            {
                "traceID": tid,
                "spanID": sid,
                "operationName": f"{svc} {kind}",
                "references": []
                if parent is None
                else [{"refType": "CHILD_OF", "traceID": tid, "spanID": parent}],
                "startTime": start,
                "duration": dur,
                "tags": [
                    {"key": "span.kind", "type": "string", "value": kind},
                    {"key": "http.request.body.size", "type": "int64", "value": size},
                ],
                "processID": svc,
            }
        )
        return sid

    def serve(svc: str, parent: str | None, start: int, dur: int) -> None:
        sid = span(svc, "server", parent, start, dur)
        callees = [c for c in CALLS.get(svc, []) if rng.random() < 0.8]
        parallel = rng.random() < 0.5
        at, slot = start + 5, (dur - 10) // max(1, len(callees))
        for c in callees:
            d = rng.randint(slot // 3, max(slot // 3, slot - 4))
            cid = span(svc, "client", sid, at + 1, d)
            serve(c, cid, at + 2, d - 2)
            at += 0 if parallel else slot

    serve("frontend", None, 1_700_000_000_000_000 + t * 3000, rng.randint(2000, 9000))
    procs = {s["processID"]: {"serviceName": s["processID"], "tags": []} for s in spans}
    return {"traceID": tid, "spans": spans, "processes": procs}


def _jaeger(path: Path, n: int, seed: int = 3) -> Path:
    """``n`` Jaeger traces in one file."""
    rng = random.Random(seed)
    path.write_text(json.dumps({"data": [_trace(rng, t) for t in range(n)]}))
    return path


@pytest.fixture()
def store(tmp_path: Path) -> ProfileStore:
    return ProfileStore(str(tmp_path / "p.db"))


def _one_batch(opts: PredictOptions, store: ProfileStore, **kw: Any) -> dict[str, Any]:
    """The reference: every graph loaded at once, one prediction over them all."""
    loaded = load_batch(opts)
    prof = store.get("reference")

    def look(name: str | None) -> Any:
        return prof

    bp = predict_architecture(loaded.batch, look, "sidecar", **kw)[1]
    return prediction_document(
        loaded.batch, bp, prof, host=this_host(), options=opts.to_dict(), created="x"
    )


def _same(streamed: dict[str, Any], whole: dict[str, Any]) -> None:
    assert streamed["components"] == whole["components"]
    assert len(streamed["graphs"]) == len(whole["graphs"])
    for a, b in zip(streamed["graphs"], whole["graphs"], strict=True):
        assert a == b  # graph by graph, every number exactly
    assert streamed["summary"] == whole["summary"]
    assert streamed.get("placement") == whole.get("placement")


@pytest.mark.parametrize(
    ("n", "rate", "pod_cpus"),
    [
        (MAX_DETAILED_GRAPHS + 60, 50.0, None),  # columns: no detail
        (MAX_DETAILED_GRAPHS - 40, 50.0, 2),  # every graph detailed, shared CPUs
        (120, None, None),  # counted rates: over every batch before the first prediction
    ],
)
def test_batches_predict_what_one_batch_predicts(
    tmp_path: Path, store: ProfileStore, n: int, rate: float | None, pod_cpus: int | None
) -> None:
    f = _jaeger(tmp_path / "t.json", n)
    opts = PredictOptions(
        (str(f),), profile="reference", rate=rate, trace_format="jaeger", pod_cpus=pod_cpus
    )
    seen: list[int] = []
    doc = predict_files(opts, store, progress=seen.append, batch_spans=300)
    assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] == n  # several batches
    assert doc["summary"]["graphs"] == n == doc["import"]["graphs_kept"]
    _same(doc, _one_batch(opts, store, pod_cpus=pod_cpus))
    detailed = n <= MAX_DETAILED_GRAPHS
    assert isinstance(doc["graphs"], list) is detailed
    assert all(("invocations" in g) is detailed for g in doc["graphs"])


def test_one_batch_when_small(tmp_path: Path, store: ProfileStore) -> None:
    """A small input is one batch: the document is the one-batch document as it was."""
    f = _jaeger(tmp_path / "t.json", 30)
    opts = PredictOptions((str(f),), profile="reference", rate=10.0, trace_format="jaeger")
    seen: list[int] = []
    doc = predict_files(opts, store, progress=seen.append)
    assert seen == [30]
    whole = _one_batch(opts, store)
    assert {**doc, "created": "x", "import": None, "warnings": None} == {
        **whole,
        "import": None,
        "warnings": None,
    }


def test_many_graphs_are_columns_and_every_export_reads_them(
    tmp_path: Path, store: ProfileStore
) -> None:
    n = MAX_DETAILED_GRAPHS + 60
    f = _jaeger(tmp_path / "t.json", n)
    opts = PredictOptions((str(f),), profile="reference", rate=20.0, trace_format="jaeger")
    doc = predict_files(opts, store, batch_spans=400)
    gs = doc["graphs"]
    assert isinstance(gs, GraphList)
    cols = gs.columns.joined()
    per_graph = sum(a.nbytes for a in cols.values()) / n
    assert per_graph < 400, per_graph  # numbers, not a dict per graph (~4 kB)
    as_list = {**doc, "graphs": list(gs)}
    assert gs[-1] == as_list["graphs"][n - 1] and gs[5:8] == as_list["graphs"][5:8]
    with pytest.raises(IndexError):
        gs[n]
    js = EXPORTERS["json"].export(doc)
    assert js == EXPORTERS["json"].export(as_list)  # the same text, graph by graph
    back = json.loads(js)
    assert len(back["graphs"]) == n and back["summary"]["graphs"] == n
    assert any("left out beyond" in w for w in back["warnings"])
    csv = EXPORTERS["csv"].export(doc)
    assert csv == EXPORTERS["csv"].export(as_list) and csv.count("\n") == n + 1
    assert EXPORTERS["markdown"].export(doc) == EXPORTERS["markdown"].export(as_list)
    assert f"{n - 20} more graphs" in prediction_text(doc)


def test_columns_spilled_to_a_file_read_back_the_same(
    tmp_path: Path, store: ProfileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = MAX_DETAILED_GRAPHS + 60
    f = _jaeger(tmp_path / "t.json", n)
    opts = PredictOptions((str(f),), profile="reference", rate=20.0, trace_format="jaeger")
    kept = predict_files(opts, store, batch_spans=400)
    monkeypatch.setattr(result, "SPILL_GRAPHS", 100)
    spilled = predict_files(opts, store, batch_spans=400)
    cols = spilled["graphs"].columns
    assert cols._file is not None and all(b.cols is None for b in cols._blocks)
    assert kept["graphs"].columns._file is None
    _same(spilled, kept)
    assert list(reversed(spilled["graphs"])) == list(reversed(kept["graphs"]))  # any order
    assert list(spilled["graphs"]) == [spilled["graphs"][g] for g in range(n)]  # block by block
    for k, v in kept["graphs"].columns.joined().items():
        assert np.array_equal(cols.joined()[k], v), k
    assert np.array_equal(cols.pct(), kept["graphs"].columns.pct(), equal_nan=True)
    for fmt in ("json", "csv", "markdown"):
        assert EXPORTERS[fmt].export({**spilled, "created": "x"}) == EXPORTERS[fmt].export(
            {**kept, "created": "x"}
        )
    a, b = (prediction_distributions("x", d) for d in (spilled, kept))
    assert np.array_equal(a[0].latency_pct, b[0].latency_pct)
    assert np.array_equal(a[0].cpu_vcpu, b[0].cpu_vcpu)


def test_whatif_after_batch_by_batch(tmp_path: Path, store: ProfileStore) -> None:
    write_examples(str(tmp_path / "ex"))
    speedup = str(tmp_path / "ex" / "whatif" / "speedup-paper.yaml")
    f = _jaeger(tmp_path / "t.json", 90)
    opts = PredictOptions(
        (str(f),), profile="reference", rate=30.0, trace_format="jaeger", speedup=speedup
    )
    seen: list[int] = []
    doc = predict_files(opts, store, progress=seen.append, batch_spans=250)
    one = predict_files(opts, store)  # one batch
    assert len(seen) >= 3
    for k in ("before", "after", "saving", "per_graph_after"):
        assert doc["whatif"][k] == one["whatif"][k], k
    assert doc["whatif"]["saving"]["cpu_vcpu_total"] > 0


def test_architectures_and_tail_take_every_graph_at_once(
    tmp_path: Path, store: ProfileStore
) -> None:
    f = _jaeger(tmp_path / "t.json", 60)
    opts = PredictOptions(
        (str(f),),
        profile="reference",
        rate=30.0,
        trace_format="jaeger",
        architectures=("sidecar", "node-l4"),
    )
    seen: list[int] = []
    doc = predict_files(opts, store, progress=seen.append, batch_spans=200)
    assert seen == []  # not streamed: node placement is over every service
    assert len(doc["architectures"]["by_architecture"][0]["graphs"]) == 60
    streamed = predict_files(replace(opts, architectures=()), store, batch_spans=200)
    a = np.array([g["latency_overhead_us"]["value"] for g in doc["graphs"]])
    b = np.array([g["latency_overhead_us"]["value"] for g in streamed["graphs"]])
    assert np.array_equal(a, b)


def test_cli_streams_many_graphs_and_says_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from click.testing import CliRunner

    from meshtax.cli import main
    from meshtax.cli.predict import _progress

    n = MAX_DETAILED_GRAPHS + 30
    f = _jaeger(tmp_path / "t.json", n)
    env = {"MESHTAX_DB": str(tmp_path / "p.db")}
    args = ["predict", "--traces", str(f), "--rate", "10", "--profile", "reference"]
    r = CliRunner().invoke(main, [*args, "--format", "json"], env=env)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["graphs"]) == doc["summary"]["graphs"] == n
    assert "invocations" not in doc["graphs"][0]
    r = CliRunner().invoke(main, args, env=env)
    assert r.exit_code == 0 and f"{n - 20} more graphs" in r.output, r.output
    say = _progress(every_s=0.0)
    say(1234)
    assert "predicted 1234 graphs so far" in capsys.readouterr().err
