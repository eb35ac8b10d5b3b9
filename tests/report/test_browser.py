"""The report in a real browser: Debian's chromium (apt), driven by Playwright's Python package.

Renders the full report offline, checks every figure is present, rendered and non-empty, and
saves a screenshot to artifacts/report/ (git-ignored) as the test's artifact.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from meshtax.report.build import Report

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "report"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium not installed (apt-get install chromium; see requirements/apt.txt)",
    ),
]

# per figure: is it in the layout, how big is its SVG, how many drawn shapes does it have
PROBE = """() => [...document.querySelectorAll('figure.mt-figure')].map(f => {
  const svg = f.querySelector('svg');
  const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  let inner = {width: 0, height: 0};
  try { inner = svg.getBBox(); } catch (e) {}
  return {id: f.id, kind: f.dataset.kind, width: r.width, height: r.height, bboxW: inner.width, bboxH: inner.height,
          shapes: svg ? svg.querySelectorAll('path, rect, use, text').length : 0,
          caption: (f.querySelector('figcaption') || {textContent: ''}).textContent.length};
})"""


def test_report_renders_every_figure_in_chromium(
    full_report: Report, full_report_file: Path
) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api",
        reason="the playwright Python package is not installed (pip install playwright)",
    )
    assert CHROMIUM is not None
    requests: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="meshtax-chromium-") as profile_dir,
        sync_api.sync_playwright() as pw,
    ):
        ctx = pw.chromium.launch_persistent_context(
            profile_dir,
            executable_path=CHROMIUM,
            args=ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
            offline=True,
        )
        try:
            page = ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(full_report_file.as_uri(), wait_until="load", timeout=15_000)
            figs: list[dict[str, Any]] = page.evaluate(PROBE)
            title = page.title()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
            page.screenshot(path=str(ARTIFACTS / "report-top.png"))
        finally:
            ctx.close()
    assert title == "meshtax report"
    assert errors == []
    assert requests == [
        full_report_file.as_uri()
    ]  # nothing fetched but the file itself: works offline
    assert [f["id"] for f in figs] == [
        c.id for c in full_report.charts
    ]  # every figure drawn, in order
    for f in figs:
        assert f["width"] > 100 and f["height"] > 50, f
        assert f["bboxW"] > 50 and f["bboxH"] > 20, f
        assert f["shapes"] > 10 and f["caption"] > 20, f
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
