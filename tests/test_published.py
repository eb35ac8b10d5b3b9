"""The benchmark's transcription of the published mesh comparison matches the workplace's
published figures, number for number (skipped when that folder is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

OURS = Path(__file__).resolve().parents[1] / "benchmarks" / "published" / "mtls-meshes.yaml"


def test_transcription_matches_the_shared_published_figures() -> None:
    base = os.environ.get("MESHTAX_SHARED_DATA")
    root = Path(base) if base else Path(__file__).resolve().parents[2] / "shared" / "data"
    path = root / "published" / "mtls-meshes.yaml"
    if not path.is_file():
        pytest.skip(f"published figures {path} not present (set MESHTAX_SHARED_DATA)")
    pub, ours = yaml.safe_load(path.read_text()), yaml.safe_load(OURS.read_text())
    for key in ("workload", "baseline", "latency_increase_with_mtls_pct", "findings"):
        assert ours[key] == pub[key], key
    for table in ("intra_node", "inter_node"):
        for mesh, row in pub[table].items():
            want = {k: v for k, v in row.items() if k not in ("model", "proxy")}
            assert ours[table][mesh] == want, (table, mesh)
    assert {m: (v["model"], v["proxy"]) for m, v in pub["intra_node"].items()} == {
        m: (v["model"], v["proxy"]) for m, v in ours["meshes"].items()
    }
