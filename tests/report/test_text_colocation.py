"""``meshtax profiles show``: the co-location calibration, or that there is none."""

from __future__ import annotations

from dataclasses import replace

from meshtax.model.profile import Colocation, ColocationPoint
from meshtax.model.sidecar import Mode
from meshtax.report.text import colocation_lines, profile_text
from tests.report import data as D


def test_profile_text_shows_the_exponent_and_every_chain() -> None:
    prof = D.golden_profile()
    assert profile_text(prof).splitlines()[-1].startswith("shared CPUs: not calibrated (α = 1")
    col = Colocation(
        0.31,
        0.05,
        0.44,
        "http",
        100.0,
        (
            ColocationPoint(1, 516.0, 455.0, 541.0, 558.0),
            ColocationPoint(8, 5619.0, 5048.0, 5846.0, 5957.0),
        ),
        "chains",
    )
    lines = profile_text(replace(prof, colocation={Mode.HTTP: col})).splitlines()
    assert lines[-3:] == colocation_lines({Mode.HTTP: col})
    assert lines[-3].startswith(
        "shared CPUs, http: α = 0.31 [0.05, 0.44] (messages priced at r_own^(1−α)·r_cpu^α; chains)"
    )
    assert lines[-1] == "  chain of 8: CPU 5619 µs/request [5048, 5846], predicted at α 5957 (+6%)"
