"""The README's short tour runs as written: every command that needs no root, in order, in
one directory, through a shell (globs like ``ex/*.yaml`` included).

Stand-ins, each for a file the tour assumes the reader has: ``traces/`` (a Jaeger file of the
test fixtures), ``manifests/`` (the fixtures' Kubernetes manifests); the million
generated graphs become 300. Commands run with ``sudo`` and the ones that compare profiles
only ``sudo meshtax profile`` makes (``my-profile``, ``whatif derive``/``study`` of measured
variants; tests/cli covers them on stored test profiles) are left out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import meshtax

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "traces" / "fixtures"


def tour() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## A short tour\s+```sh\n(.*?)```", text, re.S)
    assert block, "README has no 'A short tour' shell block"
    cmds = [ln.split("  #", 1)[0].strip() for ln in block.group(1).splitlines()]
    return [c for c in cmds if c]


@pytest.mark.slow
def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    cmds = tour()
    assert cmds[0].startswith("meshtax example --dest ex")
    (tmp_path / "traces").mkdir()
    shutil.copy(FIX / "trace.jaeger.json", tmp_path / "traces" / "trace.json")
    shutil.copytree(FIX / "k8s" / "shop", tmp_path / "manifests")
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(meshtax.__file__).resolve().parents[1]),
        "MESHTAX_DB": str(tmp_path / "profiles.db"),
    }
    ran = 0
    for cmd in cmds:
        if (
            cmd.startswith("sudo ")
            or "my-profile" in cmd
            or re.match(r"meshtax whatif (derive|study)", cmd)
        ):
            continue
        line = cmd.replace("--graphs 1000000", "--graphs 300")
        line = re.sub(r"^meshtax\b", f"{sys.executable} -m meshtax.cli", line)
        r = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        out = r.stdout + r.stderr
        assert "Traceback" not in out, f"{cmd}\n{out[-2000:]}"
        if cmd.startswith("meshtax doctor"):
            assert r.returncode in (0, 1), f"{cmd}: exit {r.returncode}\n{out[-2000:]}"
        else:
            assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{out[-2000:]}"
        ran += 1
    assert ran >= 14


@pytest.mark.parametrize("name", ["whatif/speedup-paper.yaml"])
def test_tour_speedup_is_not_picked_up_as_a_call_graph(tmp_path: Path, name: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(meshtax.__file__).resolve().parents[1])}
    subprocess.run(
        [sys.executable, "-m", "meshtax.cli", "example", "--dest", "ex"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "ex" / name).is_file()
    assert not any("speedup" in p.name for p in (tmp_path / "ex").glob("*.yaml"))
