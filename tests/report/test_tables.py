"""Report numbers computed from documents: exact values on the round-number profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshtax.report import tables as T
from tests.report import data as D


@pytest.mark.parametrize(
    ("mode", "key", "latency_us", "cpu_vcpu"),
    [
        ("tcp", "ipc", 2 * (2.5 + 0.1), 2 * (4.0 + 0.2) * 0.03),
        ("http", "parsing", 2 * (12.0 + 0.2), 2 * (20.0 + 0.4) * 0.03),
        ("http", "filter:lua", 18.0, 1.2),
        ("grpc", "other", 16.0, 0.84),
    ],
)
def test_breakdown_is_one_request_through_one_sidecar(
    mode: str, key: str, latency_us: float, cpu_vcpu: float
) -> None:
    m = {b.mode: b for b in T.breakdown(D.golden_profile().to_dict())}[mode]
    assert m.latency_us[key].value == pytest.approx(latency_us)
    assert m.cpu_vcpu[key].value == pytest.approx(cpu_vcpu)
    assert m.latency_us[key].half == 0.0  # no fit, no interval


def test_breakdown_totals_leave_filters_out_and_order_components() -> None:
    http = {b.mode: b for b in T.breakdown(D.golden_profile().to_dict())}["http"]
    assert http.base_components() == ["ipc", "read", "write", "parsing", "other"]
    assert http.filters() == ["filter:lua"]
    assert http.total("latency").value == pytest.approx(5.2 + 3.1 + 6.1 + 24.4 + 16.0)


def test_fitted_models_carry_intervals_and_samples() -> None:
    doc = D.measured_profile().to_dict()
    m = T.breakdown(doc)[0]
    assert all(c.half > 0 for c in m.latency_us.values())
    tot = m.total("latency")
    assert tot.half == pytest.approx(
        np.sqrt(sum(m.latency_us[k].half ** 2 for k in m.base_components()))
    )
    lat = T.sample_series(doc, "latency")
    assert {s.mode for s in lat} == {"tcp", "http", "grpc"}
    assert all(s.sizes.size == len(D.SIZES) for s in lat)
    cpu = [s for s in T.sample_series(doc, "cpu") if not T.is_filter(s.component)]
    assert all(s.rates is not None and s.sizes.size == len(D.SIZES) * len(D.RATES) for s in cpu)


def test_published_profile_has_no_samples() -> None:
    from meshtax.store.reference import reference_profile

    assert T.sample_series(reference_profile().to_dict(), "latency") == []


def test_comparison_differences_and_missing_components() -> None:
    from meshtax.store.reference import reference_profile

    a = D.golden_profile().to_dict()
    cmp = T.compare_profiles(a, reference_profile().to_dict())
    rows = {(r.mode, r.component): r for r in cmp.rows}
    ipc = rows[("http", "ipc")]
    assert ipc.latency_a == pytest.approx(5.2) and ipc.latency_b == pytest.approx(12.73)
    d_ipc, pct_ipc = ipc.latency_diff
    assert d_ipc == pytest.approx(12.73 - 5.2) and pct_ipc == pytest.approx(7.53 / 5.2 * 100)
    # the golden profile has no Notification; the reference has no gRPC-mode filter
    note = rows[("http", "notification")]
    assert note.latency_a is None and note.latency_b == pytest.approx(1.32)
    assert note.latency_diff == (None, None)
    lua = rows[("grpc", "filter:lua")]
    assert lua.latency_a == pytest.approx(18.0) and lua.latency_b is None
    total = rows[("http", "total")]
    assert total.latency_a == pytest.approx(54.8)
    assert total.latency_b == pytest.approx(165.17)  # the paper's HTTP total, Table 2
    d, pct = total.latency_diff
    assert d == pytest.approx(165.17 - 54.8) and pct == pytest.approx((165.17 - 54.8) / 54.8 * 100)
    http = [r.component for r in cmp.rows if r.mode == "http"]
    assert http[http.index("total") + 1 :] == [  # filters after the total
        "filter:fault_injection",
        "filter:lua",
        "filter:rate_limit",
        "filter:tap",
        "filter:wasm",
    ]


def test_doc_labels_are_unique() -> None:
    doc = {"profile": {"name": "p"}, "options": {}}
    assert T.doc_label(doc) == "p"
    assert T.doc_label(doc, ["p"]) == "p #2"
    assert T.doc_label({**doc, "label": "mine"}, ["p"]) == "mine"


def test_prediction_distributions_include_the_whatif_after() -> None:
    doc = D.prediction(D.golden_profile())
    before, after = T.prediction_distributions("x", doc)
    assert before.latency_pct.size == after.latency_pct.size == len(doc["graphs"])
    g0, a0 = doc["graphs"][0], doc["whatif"]["per_graph_after"][0]
    assert after.latency_pct[0] == pytest.approx(
        100 * a0["latency_overhead_us"] / g0["base_latency_us"]
    )
    assert np.all(after.cpu_vcpu <= before.cpu_vcpu)  # a speedup never costs more


def test_cdf_is_thinned_but_keeps_its_ends() -> None:
    x = np.arange(10_000, dtype=np.float64)[::-1]
    xs, p = T.cdf(x, points=100)
    assert xs.size <= 100 and xs[0] == 0 and xs[-1] == 9999 and p[-1] == 1.0
    assert np.all(np.diff(xs) >= 0) and np.all(np.diff(p) > 0)


@pytest.mark.parametrize(
    "case",
    [
        {
            "name": "q",
            "mode": "http",
            "latency": {"predicted": 110.0, "measured": 100.0, "lo": 95.0, "hi": 104.0},
        },
        {
            "name": "q",
            "mode": "http",
            "metric": "latency",
            "predicted": 110.0,
            "measured": 100.0,
            "measured_lo": 95.0,
            "measured_hi": 104.0,
        },
    ],
)
def test_validation_cases_nested_or_flat(case: dict[str, object]) -> None:
    (c,) = T.validation_cases({"cases": [case]})
    assert (c.name, c.metric, c.predicted, c.measured, c.measured_lo, c.measured_hi) == (
        "q (http)",
        "latency",
        110.0,
        100.0,
        95.0,
        104.0,
    )
    assert c.error_pct == pytest.approx(10.0)


def test_study_distributions_drop_missing_values() -> None:
    (d,) = T.study_distributions(
        {"configurations": {"tcp": {"latency_overhead_pct": [1.0, None, 3.0], "cpu_vcpu": [0.5]}}}
    )
    assert (
        d.label == "tcp" and d.latency_pct.tolist() == [1.0, 3.0] and d.cpu_vcpu.tolist() == [0.5]
    )


def _with_carried() -> dict[str, object]:
    """The golden profile with gRPC-through-tcp models: IPC 5 µs / 10 CPU-µs and Other
    7 µs / 25 CPU-µs per crossing, closure 12 µs (components) vs 10 µs (measured)."""
    from dataclasses import replace

    from meshtax.model.components import Component, Kind
    from meshtax.model.costmodel import ComponentModel, CostModel
    from meshtax.model.profile import Closure, ModeProfile
    from meshtax.model.sidecar import Mode

    prof = D.golden_profile()
    tcp = prof.modes[Mode.TCP]
    carried = ModeProfile(
        Mode.TCP,
        {
            Component(Kind.IPC): ComponentModel(CostModel(5.0), CostModel(10.0)),
            Component(Kind.OTHER): ComponentModel(CostModel(7.0), CostModel(25.0)),
        },
        Closure(10.0, 9.0, 11.0, 12.0, 0.15),
    )
    return replace(
        prof, modes={**prof.modes, Mode.TCP: replace(tcp, carried={"grpc": carried})}
    ).to_dict()


def test_breakdown_shows_carried_models_right_after_their_mode() -> None:
    modes = T.breakdown(_with_carried())
    assert [m.mode for m in modes] == ["tcp", "tcp+grpc", "http", "grpc"]
    g = modes[1]
    assert g.carried == "grpc" and modes[0].carried is None
    # one request = two crossings; CPU at 30 000 requests/s
    assert g.latency_us == {"ipc": T.Cell(10.0), "other": T.Cell(14.0)}
    assert g.cpu_vcpu["ipc"].value == pytest.approx(2 * 10.0 * 0.03)
    assert g.cpu_vcpu["other"].value == pytest.approx(2 * 25.0 * 0.03)
    assert g.total("latency").value == pytest.approx(24.0)
    assert (
        g.closure is not None
        and g.closure["components_us"] == 12.0
        and g.closure["measured_us"] == 10.0
    )
    # a document without carried models (older format: no key at all) is unchanged
    doc = D.golden_profile().to_dict()
    for mp in doc["modes"].values():
        mp.pop("carried")
    assert [m.mode for m in T.breakdown(doc)] == ["tcp", "http", "grpc"]


def test_html_report_has_carried_columns(tmp_path: Path) -> None:
    from meshtax.report.build import build_report

    html = build_report([], [_with_carried()], out_path=tmp_path / "r.html").read_text(
        encoding="utf-8"
    )
    assert "tcp+grpc latency (µs)" in html and "tcp+grpc CPU (vCPU)" in html
    assert (
        html.index("tcp CPU (vCPU)")
        < html.index("tcp+grpc latency (µs)")
        < html.index("http latency (µs)")
    )
