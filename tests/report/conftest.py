"""Shared report inputs; the full report is rendered once per session (it draws ~20 figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.report.build import Report, ReportInputs, render_report
from tests.report import data as D


@pytest.fixture(scope="session")
def measured() -> Profile:
    return D.measured_profile()


@pytest.fixture(scope="session")
def upgraded() -> Profile:
    return D.measured_profile("after-upgrade", seed=2, scale=0.85)


@pytest.fixture(scope="session")
def full_inputs(
    measured: Profile, upgraded: Profile
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ReportInputs]:
    """Every kind of input: examples with a what-if, many graphs in two configurations, a
    validation, a study, a measured and the published profile, and a comparison."""
    from meshtax.store.reference import reference_profile

    preds = [
        D.prediction(measured, label="examples"),
        D.many_graphs(measured, 250, SidecarConfig(Mode.HTTP), 5, "http"),
        D.many_graphs(measured, 250, SidecarConfig(Mode.GRPC, ("lua", "rbac")), 5, "grpc+lua+rbac"),
    ]
    profiles = [measured.to_dict(), reference_profile().to_dict()]
    extra = ReportInputs(
        validations=[D.validation_doc()],
        studies=[D.study_doc()],
        compare=(measured.to_dict(), upgraded.to_dict()),
        created=D.CREATED,
    )
    return preds, profiles, extra


@pytest.fixture(scope="session")
def full_report(
    full_inputs: tuple[list[dict[str, Any]], list[dict[str, Any]], ReportInputs],
) -> Report:
    return render_report(*full_inputs)


@pytest.fixture(scope="session")
def full_report_file(full_report: Report, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(full_report.html, encoding="utf-8")
    return path
