"""meshtax.validate.result and .pairing: paired overheads, errors, the document, stopping rules."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from meshtax.app.data import write_document
from meshtax.report.tables import validation_cases
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.paired import PairPolicy
from meshtax.validate.pairing import measure_pairs
from meshtax.validate.result import (
    CaseResult,
    Predicted,
    RunSample,
    ValidationResult,
    overheads,
    rel_error,
)
from meshtax.validate.sweep import SweepPoint, SweepResult


def rs(
    p50: float, cpu_ns: int, count: int = 100, p90: float | None = None, sidecar: int = 0
) -> RunSample:
    return RunSample(
        p50,
        p90 if p90 is not None else p50 * 1.5,
        p50 * 1.1,
        count,
        200.0,  # the rate the cases below ask for: not saturated
        1.0,
        {"a": cpu_ns // 2, "b": cpu_ns - cpu_ns // 2},
        sidecar,
    )


PAIRS = tuple(
    (rs(1000 + i, 10_000_000), rs(1300 + 3 * i, 30_000_000, sidecar=15_000_000)) for i in range(6)
)


def test_overheads_are_medians_of_paired_differences() -> None:
    o = overheads(PAIRS)
    # differences 300, 302, …, 310: median 305; CPU 200 µs per request on every pair
    assert o["p50"].median == pytest.approx(305.0)
    assert (o["p50"].lo, o["p50"].hi) == (300.0, 310.0)  # n=6: [x(1), x(6)] at 96.9 %
    assert o["cpu"].median == pytest.approx(200.0)
    assert o["p90"].median == pytest.approx(1.5 * 305.0)
    with pytest.raises(ValueError):
        overheads([])


def test_rel_error_and_case_document() -> None:
    assert rel_error(110, 100) == pytest.approx(0.10)
    assert math.isnan(rel_error(1, 0))
    pred = Predicted(p50_us=330.0, p90_us=400.0, mean_us=320.0, cpu_us_per_request=180.0, graphs=50)
    c = CaseResult("bookinfo", "productpage", "http", 200.0, PAIRS, pred, {"frontend": "http"})
    k = c.comparisons
    assert k["latency"].error == pytest.approx(330 / 305 - 1)
    assert k["cpu"].error == pytest.approx(-0.10)
    assert not k["latency"].within_interval and k["cpu"].predicted < k["cpu"].measured.lo
    doc = c.to_case()
    # CPU in the report's unit: vCPU at the case's rate (200/s × 200 µs = 0.04)
    assert doc["cpu"]["measured"] == pytest.approx(0.04) and doc["cpu"]["per_request_us"][
        "measured"
    ] == pytest.approx(200.0)
    assert doc["sidecar_cpu_us_per_request"] == pytest.approx(150.0)
    assert doc["cpu_by_service_us_per_request"] == {
        "a": pytest.approx(100.0),
        "b": pytest.approx(100.0),
    }
    assert len(doc["runs"]) == 6
    # the measured side comes back from the document, to be predicted again
    back = CaseResult.measured_from_case(doc)
    assert (back.topology, back.query, back.mode, back.rate, back.pairs, back.predicted) == (
        "bookinfo",
        "productpage",
        "http",
        200.0,
        PAIRS,
        None,
    )
    failed = CaseResult("bookinfo", "productpage", "grpc", 200.0, error="LoadFailed: boom")
    assert failed.comparisons == {} and failed.to_case()["error_message"] == "LoadFailed: boom"
    assert CaseResult.measured_from_case(failed.to_case()).error == "LoadFailed: boom"

    v = ValidationResult("bookinfo", (c, failed), "p1", {"host": "h"}, {"rate": 200})
    d = v.to_document()
    assert d["format"] == "meshtax-validation/1" and d["summary"]["failed"] == 1
    assert d["summary"]["cpu"]["median_abs_error"] == pytest.approx(0.10)
    assert d["summary"]["latency"]["beyond_30pct"] == []
    # the report builder reads the document as two cases (latency, cpu) of the one that ran
    got = validation_cases(d)
    assert [(x.name, x.metric) for x in got] == [
        ("bookinfo/productpage (http)", "latency"),
        ("bookinfo/productpage (http)", "cpu"),
    ]
    assert got[1].measured == pytest.approx(0.04) and got[1].predicted == pytest.approx(0.036)
    table = v.table()
    assert (
        "| bookinfo/productpage | http | 305 [300, 310] | 330 | +8% |" in table
        and "failed: LoadFailed: boom" in table
        and "warnings" not in table
    )
    # what the prediction warned of is said under the table, once however many cases said it
    big = "messages up to 131072 B are larger than the largest size profile 'p' measured"
    said = CaseResult(c.topology, c.query, "grpc", c.rate, PAIRS, replace(pred, warnings=(big,)))
    again = replace(said, mode="tcp")
    lines = ValidationResult("bookinfo", (c, said, again), "p1", {}, {}).table().splitlines()
    assert lines[-2:] == ["The predictions' warnings:", f"- {big}"]


def test_cpu_error_is_reported_by_the_pods_cpu_load() -> None:
    """Mesh runs burn 300 CPU-µs per request (PAIRS): 0.06 CPU-s/s at 200/s, 0.6 at 2000/s."""
    lo = CaseResult(
        "t", "a", "http", 200.0, PAIRS, Predicted(300.0, 400.0, 300.0, 180.0, 1)
    )  # −10 %
    hi1 = CaseResult(
        "t", "b", "http", 2000.0, PAIRS, Predicted(300.0, 400.0, 300.0, 140.0, 1)
    )  # −30 %
    hi2 = CaseResult(
        "t", "c", "grpc", 2000.0, PAIRS, Predicted(300.0, 400.0, 300.0, 180.0, 1)
    )  # −10 %
    assert lo.pod_load == pytest.approx(0.06) and hi1.pod_load == pytest.approx(0.6)
    v = ValidationResult("t", (lo, hi1, hi2, CaseResult("t", "d", "tcp", 200.0, error="x")), "p")
    bands = v.summary()["cpu_by_load"]
    assert [(b["load_lo"], b["load_hi"], b["cases"]) for b in bands] == [
        (0.0, 0.25, 1),
        (0.5, math.inf, 2),
    ]
    assert bands[0]["mean_error"] == pytest.approx(-0.10) and bands[1][
        "mean_error"
    ] == pytest.approx(-0.20)
    assert bands[1]["median_abs_error"] == pytest.approx(0.20)
    assert (
        "CPU bias by the pods' CPU load (CPU-s/s with the mesh; cases): 0–0.25: -10% (1); ≥ 0.5: -20% (2)."
        in v.table()
    )


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("noise", "policy", "n", "why"),
    [
        (
            [0.0] * 20,
            PairPolicy(6, 12),
            6,
            "narrow",
        ),  # identical runs: tight at once
        (
            [0.0, 500.0] * 10,
            PairPolicy(6, 8),
            8,
            "max_rounds",
        ),  # wild: never narrow
        (
            [0.0, 500.0] * 10,
            PairPolicy(3, 20, 10.0),
            5,
            "budget",
        ),  # 2 s a pair: 5th ends at 10 s
    ],
)
def test_measure_pairs_alternates_and_stops(
    noise: list[float], policy: PairPolicy, n: int, why: str
) -> None:
    clock = Clock()
    order: list[str] = []

    def run(side: str) -> RunSample:
        order.append(side)
        clock.t += 1.0
        k = order.count("mesh")
        return rs(
            1000.0 + (300.0 + noise[k % len(noise)] if side == "mesh" else 0.0),
            10_000_000 if side == "no_mesh" else 30_000_000,
        )

    pairs, stop = measure_pairs(run, policy, clock=clock)
    assert (len(pairs), stop) == (n, why)
    # the order alternates so drift falls on both sides
    assert order[:4] == ["no_mesh", "mesh", "mesh", "no_mesh"]
    assert all(m.p50_us > b.p50_us for b, m in pairs)


def test_sweep_document_and_reports(tmp_path: Path) -> None:
    pred = Predicted(p50_us=60.0, p90_us=70.0, mean_us=60.0, cpu_us_per_request=50.0, graphs=1)
    pts = tuple(SweepPoint(float(s), s, 200.0, PAIRS, pred) for s in (100, 65536))
    r = SweepResult("size", "http", pts, "p1", 0.0, {"host": "h"}, {"rate": 200})
    assert [c.query for c in r.cases()] == ["100 B", "65536 B"]
    doc = r.to_document()
    assert doc["name"] == "sweep-size-http" and doc["sweep"]["x"] == [100.0, 65536.0]
    assert doc["cases"][1]["latency"]["error"] == pytest.approx(60 / 305 - 1)
    rate = SweepResult("rate", "tcp", (SweepPoint(0.25, 100, 2000.0, PAIRS, pred),), "p1", 8000.0)
    assert rate.cases()[0].query == "25% of max (2000/s)"
    store = ProfileStore(tmp_path / "db")
    j = write_document(doc, str(tmp_path / "s.json"), store)
    assert json.loads(j.read_text())["format"] == "meshtax-validation/1"
    h = write_document([doc, rate.to_document()], str(tmp_path / "s.html"), store)
    text = h.read_text()
    assert "Validation: sweep-size-http" in text and "Validation: sweep-rate-tcp" in text


def test_cases_beyond_30_percent_name_what_the_data_say() -> None:
    # latency +64 % and CPU +50 %: the latency error is the CPU's; nothing explains the CPU's
    far = CaseResult(
        "bookinfo",
        "productpage",
        "http",
        200.0,
        PAIRS,
        Predicted(500.0, 700.0, 500.0, 300.0, 10),
        {"a": "http"},
    )
    assert far.factors("latency") == [
        "it follows the CPU error (+50%): on shared CPUs a request's latency overhead is its CPU work"
    ]
    assert far.factors("cpu") == []
    # a wide measured interval on a busy CPU (6 500 CPU-µs per request at 200/s = 1.3 CPU-s/s), prediction inside it
    wide = tuple(
        (rs(1000, 10_000_000), rs(1000 + d, 10_000_000 + 290_000_000 + 1_000_000 * d))
        for d in (100, 200, 300, 400, 500, 600)
    )
    busy = CaseResult(
        "online-boutique",
        "index",
        "tcp",
        200.0,
        wide,
        Predicted(150.0, 200.0, 150.0, 2000.0, 10),
        {"a": "tcp"},
    )
    why = busy.factors("latency")
    assert (
        why[0] == "the measurement is uncertain: its 95 % interval [100, 600] is ±71% of the median"
    )
    assert why[1:] == [
        "the prediction lies inside the measured 95 % interval",
        "the pods keep their shared CPU busy (1.30 CPU-s/s): co-located working sets and queueing, "
        "which one-hop models do not see",
        "it follows the CPU error (-69%): on shared CPUs a request's latency overhead is its CPU work",
    ]
    v = ValidationResult("x", (far, busy), "p")
    assert set(v.summary()["beyond_30pct_factors"]) == {
        "bookinfo/productpage (http) latency",
        "bookinfo/productpage (http) cpu",
        "online-boutique/index (tcp) latency",
        "online-boutique/index (tcp) cpu",
    }
    assert "- bookinfo/productpage (http) cpu: unexplained" in v.table().splitlines()
