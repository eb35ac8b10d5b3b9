"""meshtax.validate.suite_result: the Markdown both sets side by side with the hold-out's
targets, and the machine's speed under each set."""

from __future__ import annotations

from dataclasses import replace

from meshtax.model.speed import Speed
from meshtax.validate.suite_result import SuiteResult
from tests.validate.test_suite_run import CASES


def test_markdown_puts_both_sets_side_by_side_with_the_targets() -> None:
    sets = {
        "calibration": CASES[:2],
        "holdout": CASES[2:],
    }
    res = SuiteResult(
        {"name": "t"},
        sets,
        profile={
            "name": "p1",
            "how": "measured in this sitting, quick",
            "created": "2026-11-23T06:00:00",
            "closure": {"tcp": {"error": -0.04, "closes": True}},
        },
        machine={"host": "AMD EPYC", "cpus": 2, "kernel": "6.18", "loadavg": [1.0, 0.5, 0.25]},
        options={"duration_s": 3.0, "quick": False, "rates": "100"},
        started="2026-11-23T06:00:00Z",
        finished="2026-11-23T06:40:00Z",
        loadavg_end=[2.0, 1.5, 1.0],
    )
    md = res.markdown()
    assert (
        "| metric | calibration (2 of 2 cases) | holdout (3 of 4 cases) | hold-out target |" in md
    )
    # hold-out latency: +40, +5, −50 % → median 40 %, bias −1.7 %, 90th pct 50 %, 2 beyond
    assert "| latency p50: median abs. error | 15.0% | 40.0% | ≤ 15% not met |" in md
    assert "| latency p50: bias (mean signed error) | -5.0% | -1.7% | ±10% met |" in md
    assert "| latency p50: beyond 30% | 0 (0.0%) | 2 (66.7%) | ≤ 10% of cases not met |" in md
    assert "| failed | 0 | 1 |" in md
    assert "tcp -4% (closes)" in md and "1.00/0.50/0.25 at the start" in md
    # hold-out CPU: −10, +35, 0 % → median 10 %, bias +8.3 %, 1 of 3 beyond
    assert res.targets()["cpu"] == {"median_abs_error": True, "bias": True, "beyond_share": False}
    docs = res.validation_documents()
    assert [d["name"] for d in docs] == ["t: calibration set", "t: holdout set"]


def _at(sidecar_us: float) -> Speed:
    return Speed(10_000.0, 40_000.0, 150.0, "2026-11-27T08:00:00+00:00", sidecar_us * 1e3)


def test_speed_line_shows_each_sets_machine_and_the_order() -> None:
    cal = tuple(replace(c, speed=_at(v)) for c, v in zip(CASES[:2], (80.0, 84.0), strict=True))
    hold = tuple(
        replace(c, speed=_at(v) if v else None)
        for c, v in zip(CASES[2:], (90.0, 0.0, 86.0, 100.0), strict=True)
    )
    res = SuiteResult(
        {"name": "t"},
        {"calibration": cal, "holdout": hold},
        profile={"name": "p1", "quality": {"speed": _at(75.5).to_dict()}},
        options={"order": "interleaved"},
    )
    assert res.speeds() == {"calibration": [80.0, 84.0], "holdout": [90.0, 86.0, 100.0]}
    line = res.speed_line()
    assert "calibration 82.0 (80.0–84.0), holdout 90.0 (86.0–100.0)" in line
    assert "the profile 75.5; sets measured interleaved." in line
    assert line in res.markdown()
    # runs before the order was recorded measured set after set; no speeds: no line
    old = replace(res, options={})
    assert old.speed_line().endswith("sets measured set after set.")
    none = replace(res, sets={"holdout": tuple(replace(c, speed=None) for c in hold)})
    assert none.speed_line() == "" and "Machine speed" not in none.markdown()
