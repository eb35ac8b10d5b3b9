"""The benchmark's transcription of the published mesh comparison matches the workplace's
published figures, number for number (skipped when that folder is absent)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

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


def _bench_meshes() -> Any:
    path = OURS.parents[1] / "bench_meshes.py"
    spec = importlib.util.spec_from_file_location("bench_meshes", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_meshes_reports_failed_runs_next_to_the_measured() -> None:
    bm = _bench_meshes()

    def run(mesh: str, p99: float) -> dict[str, Any]:
        side = {"client": 0.02, "server": 0.01}
        return {
            "mesh": mesh, "placement": "intra", "round": 0, "p99_s": p99, "qps": 400.0, "errors": 0,
            "cpu_cores_total": 0.03, "cpu_cores": side, "memory_mib": side,
        }  # fmt: skip

    doc = {
        "options": {"rate": 400, "connections": 400, "delay_ms": 200, "rounds": 1},
        "runs": [run("baseline", 0.3), run("envoy", 0.8)],
        "failed": [{"mesh": "waypoint", "placement": "intra", "round": 0, "error": "503"}],
    }
    text = bm.report(doc)
    assert "| envoy | 500.0 [500.0, 500.0] |" in text
    assert "failed: waypoint intra-node, round 0: 503" in text
    assert "**Published, inter-node**" in text
