"""Figures: drawn when their data is there, absent (None) when not, and well-formed inline SVG."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from meshtax.model.profile import Profile
from meshtax.report import figures as F
from meshtax.report import graph_figures as G
from meshtax.report import tables as T
from meshtax.report.build import Report
from meshtax.store.reference import reference_profile
from tests.report import data as D


def _paths(svg: str) -> int:
    return len(re.findall(r"<path\b", svg))


def test_profile_figures_of_a_measured_profile(measured: Profile) -> None:
    doc = measured.to_dict()
    charts = [
        F.breakdown_chart(doc),
        F.filters_chart(doc),
        F.latency_size_chart(doc),
        F.cpu_chart(doc),
    ]
    assert [c.kind if c else None for c in charts] == [
        "breakdown",
        "filters",
        "latency-size",
        "cpu-size-rate",
    ]
    for c in charts:
        assert (
            c is not None
            and c.svg.startswith("<svg")
            and c.svg.rstrip().endswith("</svg>")
            and _paths(c.svg) > 10
        )


def test_published_profile_has_a_breakdown_but_no_sample_figures() -> None:
    doc = reference_profile().to_dict()
    # Table 2 and Table 3 give a breakdown and filter costs, but no samples to draw models from
    assert F.breakdown_chart(doc) is not None and F.filters_chart(doc) is not None
    assert F.latency_size_chart(doc) is None and F.cpu_chart(doc) is None


def test_callgraph_highlights_exactly_the_critical_hops() -> None:
    doc = D.prediction(D.golden_profile(), whatif=False)
    for g in doc["graphs"]:
        c = G.callgraph_chart("x", g)
        assert c is not None
        # critical edges: thick red strokes (2.6 pt, scaled to px in the SVG); one per critical invocation
        red = re.findall(r'<path d="[^"]*"[^>]*stroke: ?#d62728; ?stroke-width: ?([0-9.]+)', c.svg)
        widths = Counter(red)
        thick = max(widths, key=float)
        assert widths[thick] == sum(inv["critical"] for inv in g["invocations"]), g["name"]
        for inv in g["invocations"]:
            assert f"+{inv['latency_added_us']:.0f} µs" in c.svg


def test_whatif_before_after_and_cdf() -> None:
    doc = D.prediction(D.golden_profile())
    w = G.whatif_chart("x", doc)
    assert w is not None and "before" in w.svg and "after" in w.svg
    assert G.whatif_chart("x", {**doc, "whatif": None}) is None
    c = G.cdf_chart(T.prediction_distributions("x", doc))
    assert c is not None and f"n={len(doc['graphs'])}" in c.svg
    assert G.cdf_chart([]) is None


def test_validation_chart_labels_errors() -> None:
    cases = T.validation_cases(D.validation_doc())
    c = G.validation_chart(cases)
    assert c is not None
    for case in cases:
        assert f"{case.error_pct:+.0f}%" in c.svg
    assert G.validation_chart([]) is None


def test_ids_are_unique_across_the_whole_report(full_report: Report) -> None:
    ids = re.findall(r'\bid="([^"]+)"', full_report.html)
    dup = [i for i, n in Counter(ids).items() if n > 1]
    assert dup == []
    # every reference inside an SVG points at an element of the same page
    refs = set(re.findall(r"url\(#([^)]+)\)", full_report.html)) | set(
        re.findall(r'href="#([^"]+)"', full_report.html)
    )
    assert refs <= set(ids)


def test_full_report_draws_every_kind(full_report: Report) -> None:
    kinds = Counter(c.kind for c in full_report.charts)
    assert set(kinds) == {
        "overview",
        "callgraph",
        "whatif",
        "cdf",
        "validation",
        "breakdown",
        "filters",
        "latency-size",
        "cpu-size-rate",
        "comparison",
    }
    assert (
        kinds["breakdown"] == 2 and kinds["latency-size"] == 1
    )  # the published profile has no samples
    assert any("no latency samples" in n for n in full_report.notes)


@pytest.mark.parametrize("n", [1, 3])
def test_svg_is_reproducible(n: int) -> None:
    doc = D.golden_profile().to_dict()
    assert len({F.breakdown_chart(doc).svg for _ in range(n)}) == 1  # type: ignore[union-attr]
