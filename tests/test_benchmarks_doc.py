"""Every command BENCHMARKS.md gives runs a script in the repository, with its paths given as
arguments: no script outside the repository, no temporary path from someone's machine; and
every experiment says in experiments/README.md what it showed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "BENCHMARKS.md").read_text()
# commands live in fenced blocks and in `inline code`
CODE = re.findall(r"```(?:sh|bash)?\n(.*?)```", DOC, re.S) + re.findall(r"`([^`\n]+)`", DOC)
SCRIPT = re.compile(r"(?<![\w/.-])((?:benchmarks|experiments|scripts)/[\w./-]+\.(?:py|sh))")


def test_every_script_named_exists() -> None:
    named = {m for block in CODE for m in SCRIPT.findall(block)}
    assert named, "BENCHMARKS.md names no script"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, missing


def test_no_temporary_paths_from_a_machine() -> None:
    bad = sorted({m for block in CODE for m in re.findall(r"/tmp/[\w./*-]+", block)})
    assert not bad, f"commands with machine-local paths (give them as arguments): {bad}"


def test_no_inline_python_instead_of_a_script() -> None:
    inline = [b for b in CODE if "python -c" in b]
    assert not inline, inline


def test_every_experiment_has_a_row_in_its_readme() -> None:
    readme = (ROOT / "experiments" / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    scripts = sorted(
        p.name
        for p in (ROOT / "experiments").iterdir()
        if p.suffix in {".py", ".sh", ".bt"} and not p.name.startswith("_")  # _x.py: shared code
    )
    assert scripts, "no experiments found"
    missing = [n for n in scripts if not any(f"`{n}`" in row.split(" | ")[0] for row in rows)]
    assert not missing, f"experiments without a row in experiments/README.md: {missing}"
