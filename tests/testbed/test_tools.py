"""Where meshtax finds its programs, and that it refuses one of its own built from older code."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from meshtax.testbed.tools import INSTALLED, ROOT, ToolMissing, ToolStale, stale_source, tool

PROBE = str(INSTALLED["probe"][0])
SIDECAR_C = str(ROOT / "bpf" / "sidecar.c")


@dataclass
class Files:
    """A host that has ``times`` (path → modification time) and nothing else."""

    times: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def euid(self) -> int:
        return 0

    def mounts(self) -> list[tuple[str, str]]:
        return []

    def exists(self, path: str) -> bool:
        return path in self.times

    def mtime(self, path: str) -> float | None:
        return self.times.get(path)

    def which(self, name: str) -> str | None:
        return None

    def getenv(self, name: str) -> str | None:
        return self.env.get(name)

    def kernel_release(self) -> str:
        return "6.18.0"

    def memlock(self) -> tuple[int, int]:
        return (0, 0)

    def set_memlock(self, soft: int, hard: int) -> None:
        pass

    def envoy_wheel_binary(self) -> str | None:
        return None


def test_a_probe_newer_than_its_sources_is_used() -> None:
    h = Files({PROBE: 200.0, SIDECAR_C: 100.0})
    assert tool("probe", h) == ROOT / "bpf" / ".output" / "sidecar"
    assert stale_source("probe", PROBE, h) is None


def test_a_probe_older_than_a_source_is_refused_with_the_rebuild_command() -> None:
    h = Files({PROBE: 100.0, SIDECAR_C: 200.0})
    with pytest.raises(ToolStale) as e:
        tool("probe", h)
    assert str(e.value.source) == SIDECAR_C
    assert "make -C" in str(e.value) and "older than its source" in str(e.value)
    assert isinstance(e.value, ToolMissing)  # reported like a missing tool, as a user error


def test_another_programs_sources_do_not_make_the_probe_stale() -> None:
    h = Files({PROBE: 100.0, str(ROOT / "bpf" / "sockredir.c"): 200.0})
    assert tool("probe", h) == ROOT / "bpf" / ".output" / "sidecar"


def test_a_program_given_by_environment_is_taken_as_given() -> None:
    h = Files({"/opt/probe": 1.0, SIDECAR_C: 200.0}, env={"MESHTAX_PROBE": "/opt/probe"})
    assert str(tool("probe", h)) == "/opt/probe"


def test_a_missing_probe_says_how_to_build_it() -> None:
    with pytest.raises(ToolMissing) as e:
        tool("probe", Files())
    assert not isinstance(e.value, ToolStale)
    assert "make -C" in e.value.fix
