"""The what-if study section: table rows with exact text, CDF figures per size, the document
recognised among result files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.report.build import ReportInputs, load_result_file, render_report
from meshtax.report.whatif import whatif_cdf_chart, whatif_rows


def _dist(mean: float) -> dict[str, Any]:
    return {"n": 10, "mean": mean, "quantiles": list(np.linspace(0.5 * mean, 2 * mean, 11))}


def doc() -> dict[str, Any]:
    uds = {
        "label": "uds",
        "latency_overhead_us": _dist(75.0),
        "cpu_vcpu": _dist(0.9),
        "reduction_pct": {
            "latency": {"value": 25.0, "lo": 20.0, "hi": 30.0, "se": 2.55},
            "cpu": {"value": 10.0, "lo": None, "hi": None, "se": None},
        },
        "published": {
            "headline_latency_pct": 27.0,
            "headline_cpu_pct": 18.0,
            "latency_pct": 24.65,
            "cpu_pct": 17.44,
            "size_label": "100 B",
        },
    }
    zc = {
        "label": "zerocopy",
        "latency_overhead_us": _dist(110.0),
        "cpu_vcpu": _dist(1.2),
        "reduction_pct": {"latency": {"value": -10.0, "lo": -14.0, "hi": -6.0}, "cpu": {}},
        "published": {"summary": "negligible: …"},
    }
    return {
        "format": "meshtax-whatif-study/1",
        "name": "fig13",
        "base_profile": "rs-tcp",
        "platform": "Test CPU, 2 cores",
        "mode": "tcp",
        "interval": "95 %",
        "sizes": [
            {
                "size": 100.0,
                "graphs": 10,
                "baseline": {"latency_overhead_us": _dist(100.0), "cpu_vcpu": _dist(1.0)},
                "variants": [uds, zc],
            },
            {"size": 4096.0, "graphs": 10, "baseline": {}, "variants": []},
        ],
    }


def test_rows_say_before_after_reduction_and_the_paper() -> None:
    assert whatif_rows(doc()) == [
        [
            "uds",
            "100 B",
            "100.0 → 75.0",
            "+25.0 % [+20.0, +30.0]",
            "24.6 % at 100 B; 27 % headline",
            "1 → 0.9",
            "+10.0 %",
            "17.4 % at 100 B; 18 % headline",
        ],
        [
            "zerocopy",
            "100 B",
            "100.0 → 110.0",
            "-10.0 % [-14.0, -6.0]",
            "negligible",
            "1 → 1.2",
            "-",
            "negligible",
        ],
    ]


def test_section_draws_a_cdf_per_size_with_data_and_says_what_is_missing(tmp_path: Path) -> None:
    d = doc()
    c = whatif_cdf_chart("fig13", d["sizes"][0])
    assert c is not None and c.kind == "cdf" and "uds (mean 75)" in c.svg
    assert whatif_cdf_chart("fig13", d["sizes"][1]) is None
    rep = render_report(extra=ReportInputs(whatif_studies=[d], created="2026-01-01T00:00:00"))
    assert "What-if study: fig13" in rep.html and "+25.0 % [+20.0, +30.0]" in rep.html
    assert [ch.id for ch in rep.charts] == ["whatif-cdf-fig13-100-b"]
    assert rep.notes == ["fig13 at 4 KB: no distributions"]
    path = tmp_path / "w.json"
    path.write_text(json.dumps(d))
    assert load_result_file(path)[0] == "whatif"
