"""Golden files for the JSON, CSV and Markdown exporters (fixed ``created``, round-number profile).

Regenerate after an intended change: ``MESHTAX_UPDATE_GOLDEN=1 pytest tests/report/test_golden.py``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from meshtax.report.exporters import EXPORTERS
from meshtax.report.markdown import comparison_markdown
from meshtax.report.tables import compare_profiles
from tests.report import data as D

GOLDEN = Path(__file__).parent / "golden"
FIXTURES = Path(__file__).parent / "fixtures"


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MESHTAX_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with MESHTAX_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} differs from its golden file (MESHTAX_UPDATE_GOLDEN=1 to accept)"
    )


def _prediction() -> dict[str, Any]:
    doc = D.prediction(D.golden_profile(), sorted(FIXTURES.glob("*.yaml")))
    doc["tool"]["version"] = "test"  # the golden file outlives version bumps
    return doc


@pytest.mark.parametrize("fmt", ["json", "csv", "markdown"])
def test_prediction_export_matches_golden(fmt: str) -> None:
    ex = EXPORTERS[fmt]
    _check(f"prediction{ex.suffix}", ex.export(_prediction()))


@pytest.mark.parametrize("fmt", ["json", "csv", "markdown"])
def test_profile_export_matches_golden(fmt: str) -> None:
    ex = EXPORTERS[fmt]
    _check(f"profile{ex.suffix}", ex.export(D.golden_profile().to_dict()))


def test_comparison_markdown_matches_golden() -> None:
    b = D.golden_profile().to_dict()
    b["name"] = "golden-upgraded"
    b["modes"]["http"]["components"]["parsing"]["latency"]["intercept"] = 9.0
    _check("comparison.md", comparison_markdown(compare_profiles(D.golden_profile().to_dict(), b)))


def test_exports_are_deterministic() -> None:
    for fmt in ("json", "csv", "markdown"):
        assert EXPORTERS[fmt].export(_prediction()) == EXPORTERS[fmt].export(_prediction())


def test_markdown_refuses_unknown_documents() -> None:
    with pytest.raises(ValueError, match="not a prediction or profile"):
        EXPORTERS["markdown"].export({"format": "something-else"})
