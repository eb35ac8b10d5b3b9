"""Facts about the machine meshtax runs on (reads /proc; no root needed)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from meshtax.model.profile import Platform


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
