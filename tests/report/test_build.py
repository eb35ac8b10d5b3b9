"""The HTML report file: self-contained, every input kind accepted, result files classified."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from meshtax.report.build import ReportInputs, build_report, load_result_file, report_from_files
from meshtax.report.exporters import EXPORTERS
from tests.report import data as D

FIXTURES = Path(__file__).parent / "fixtures"


def test_report_is_one_self_contained_file(full_report_file: Path) -> None:
    html = full_report_file.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    assert (
        "<script" not in html
        and "<link" not in html
        and "<img" not in html
        and "@import" not in html
    )
    # the only URLs are XML namespaces, never something to fetch
    urls = set(re.findall(r"https?://[^\"'\s)<>]+", html))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    for section in (
        "Prediction: examples",
        "Overhead across call graphs",
        "Validation: synthetic validation",
        "Profile: this-host",
        "Profile: reference",
        "Comparison: this-host vs after-upgrade",
    ):
        assert section in html


def test_build_report_writes_atomically_and_creates_parents(tmp_path: Path) -> None:
    out = build_report(
        [],
        [D.golden_profile().to_dict()],
        extra=ReportInputs(created=D.CREATED),
        out_path=tmp_path / "a" / "b" / "r.html",
    )
    assert out.exists() and not list(out.parent.glob("*.tmp"))
    assert "Profile: golden" in out.read_text(encoding="utf-8")


def test_empty_report_says_so(tmp_path: Path) -> None:
    out = build_report([], [], out_path=tmp_path / "r.html")
    assert "Nothing to show" in out.read_text(encoding="utf-8")


def test_html_exporter_handles_predictions_and_profiles() -> None:
    ex = EXPORTERS["html"]
    assert ex.suffix == ".html"
    assert 'data-kind="callgraph"' in ex.export(
        D.prediction(D.golden_profile(), sorted(FIXTURES.glob("*.yaml"))[:1], whatif=False)
    )
    assert 'data-kind="breakdown"' in ex.export(D.golden_profile().to_dict())
    with pytest.raises(ValueError):
        ex.export({})


def test_result_files_are_classified_by_format(tmp_path: Path) -> None:
    files = {
        "pred.json": D.prediction(
            D.golden_profile(), sorted(FIXTURES.glob("*.yaml")), whatif=False
        ),
        "val.json": D.validation_doc(),
        "study.json": D.study_doc(),
        "prof.json": D.golden_profile().to_dict(),
    }
    for name, doc in files.items():
        (tmp_path / name).write_text(json.dumps(doc))
    kinds = {name: load_result_file(tmp_path / name)[0] for name in files}
    assert kinds == {
        "pred.json": "prediction",
        "val.json": "validation",
        "study.json": "study",
        "prof.json": "profile",
    }
    assert (
        load_result_file(tmp_path / "pred.json")[1]["label"] == "pred"
    )  # the file stem names it in the report
    out = report_from_files(
        [tmp_path / n for n in files], out_path=tmp_path / "r.html", created=D.CREATED
    )
    html = out.read_text(encoding="utf-8")
    for kind in ("overview", "callgraph", "validation", "cdf", "breakdown"):
        assert f'data-kind="{kind}"' in html


@pytest.mark.parametrize(
    ("content", "message"),
    [("{", "not JSON"), ("[1]", "expected a JSON object"), ('{"format": "x"}', "not a meshtax")],
)
def test_bad_result_files_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "f.json").write_text(content)
    with pytest.raises(ValueError, match=message):
        load_result_file(tmp_path / "f.json")
    with pytest.raises(ValueError, match="not found"):
        load_result_file(tmp_path / "missing.json")
