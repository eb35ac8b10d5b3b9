"""``meshtax whatif study`` end to end on stored profiles and a generated trace store."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from meshtax.cli import main
from meshtax.store.sqlite import ProfileStore
from tests.app.test_whatif_study import BASE, UDS, trace_store  # noqa: F401 - the fixture


def test_whatif_study_prints_reductions_and_writes_the_study(
    trace_store: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "p.db")
    ProfileStore(db).save(BASE)
    ProfileStore(db).save(UDS)
    out = tmp_path / "out"
    args = ["whatif", "study", "--base", "base", "--variant", "uds=uds", "--db", db]
    args += ["--store", f"100={trace_store}", "--out", str(out)]
    r = CliRunner().invoke(main, [*args, "--report", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "whatif-study.json").read_text())
    cpu = doc["sizes"][0]["variants"][0]["reduction_pct"]["cpu"]
    row = next(line for line in r.output.splitlines() if line.startswith("uds | 100 B"))
    assert f"+{cpu['value']:.1f} % [+{cpu['lo']:.1f}, +{cpu['hi']:.1f}]" in row
    assert "27 % headline" in row and (tmp_path / "r.html").is_file()
    for size in ("x", "nan", "inf", "-100", "0"):
        a = [*args[:-4], "--store", f"{size}=y", "--out", str(out)]
        bad = CliRunner().invoke(main, a)
        assert bad.exit_code == 2 and "BYTES must be a size in bytes" in bad.output, size
    bad = CliRunner().invoke(main, [*args, "--rate", "nan"])
    assert bad.exit_code == 2 and "--rate" in bad.output
