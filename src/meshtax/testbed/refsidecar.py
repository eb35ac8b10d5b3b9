"""The reference sidecar (``refsidecar/``, a small L4 proxy in C) as a testbed process: its
options (pure, :class:`RefsidecarConfig`) and a running instance (:class:`RefsidecarProcess`,
like :class:`~meshtax.testbed.envoy.process.EnvoyProcess`).

It is what Envoy cannot be: a proxy whose app-facing legs can be Unix sockets *and* whose
writes can be ``MSG_ZEROCOPY``, so the kernel-side components of those optimizations are
measured with the same probes as Envoy's (``refsidecar/README.md``). L4 only: tcp mode.

Every side effect goes through :class:`~meshtax.testbed.system.System`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from meshtax.testbed.envoy.config import config_hash
from meshtax.testbed.lifecycle import Started
from meshtax.testbed.system import Placement, Process, System
from meshtax.testbed.tools import tool

__all__ = [
    "READY",
    "RefsidecarConfig",
    "RefsidecarError",
    "RefsidecarProcess",
    "parse_version",
    "refsidecar_version",
]

#: what refsidecar prints on stderr once its listeners are open
READY = "refsidecar: ready"
IPCS = ("tcp", "uds")
WRITES = ("copy", "zerocopy")


class RefsidecarError(RuntimeError):
    """refsidecar refused its options, failed to start, or printed no counters."""


def parse_version(text: str) -> str:
    """``refsidecar 0.1.0`` → ``0.1.0``."""
    parts = text.split()
    if len(parts) >= 2 and parts[0] == "refsidecar":
        return parts[1]
    raise RefsidecarError(f"cannot parse refsidecar's version from {text!r}")


def refsidecar_version(system: System, binary: Path | None = None) -> str:
    """refsidecar's version (``refsidecar --version``)."""
    return parse_version(system.run([str(binary or tool("refsidecar")), "--version"]).stdout)


@dataclass(frozen=True)
class RefsidecarConfig:
    """Options of one refsidecar, as Istio lays a sidecar out.

    ``app``: where inbound traffic goes — ``(host, port)``, a Unix socket path (``ipc="uds"``),
    or None for the original destination (``SO_ORIGINAL_DST`` after an iptables REDIRECT).
    ``outbound``: the outbound listener, ``host:port`` or (``ipc="uds"``) a socket path.
    ``write="zerocopy"``: ``MSG_ZEROCOPY`` sends of at least ``zerocopy_min`` bytes on its TCP
    sockets (Unix sockets always copy).
    """

    app: tuple[str, int] | str | None = None
    inbound: str = "0.0.0.0:15006"
    outbound: str = "0.0.0.0:15001"
    ipc: str = "tcp"
    write: str = "copy"
    zerocopy_min: int = 10240
    workers: int = 1

    def __post_init__(self) -> None:
        if self.ipc not in IPCS:
            raise ValueError(f"refsidecar ipc {self.ipc!r}: expected {' or '.join(IPCS)}")
        if self.write not in WRITES:
            raise ValueError(f"refsidecar write {self.write!r}: expected {' or '.join(WRITES)}")
        if self.zerocopy_min < 0 or self.workers < 1:
            raise ValueError("refsidecar: zerocopy_min >= 0 and workers >= 1")
        uds = self.ipc == "uds"
        if uds != isinstance(self.app, str) or (uds and ":" in self.outbound):
            raise ValueError(
                "refsidecar: with ipc uds the app and the outbound listener are Unix socket "
                "paths, with ipc tcp they are host:port"
            )

    def argv(self, binary: Path) -> list[str]:
        """The command line."""
        out = [str(binary), "--inbound", self.inbound, "--outbound", self.outbound]
        if self.app is not None:
            app = self.app if isinstance(self.app, str) else f"{self.app[0]}:{self.app[1]}"
            out += ["--app", app]
        out += ["--ipc", self.ipc, "--write", self.write]
        out += ["--zerocopy-min", str(self.zerocopy_min), "--workers", str(self.workers)]
        return out

    def key(self) -> str:
        """Hash of what shapes the proxy's work, independent of addresses and paths (a
        static app and the original destination differ: the latter asks the kernel)."""
        neutral = replace(
            self,
            app=None if self.app is None else "/uds" if isinstance(self.app, str) else ("a", 1),
            inbound="in",
            outbound="/uds" if self.ipc == "uds" else "out",
            zerocopy_min=self.zerocopy_min if self.write == "zerocopy" else 0,
        )
        return config_hash({"refsidecar": neutral.argv(Path("refsidecar"))[1:]})


class RefsidecarProcess(Started):
    """One running refsidecar, placed by a :class:`Placement`; use as a context manager.

    Ready once it prints :data:`READY` on stderr (logged to ``refsidecar.log``); on stop it
    prints its counters as one JSON line on stdout (``counters.json``), kept in
    :attr:`counters`.
    """

    def __init__(
        self,
        system: System,
        config: RefsidecarConfig,
        workdir: Path,
        place: Placement = Placement(),
        binary: Path | None = None,
        *,
        start_timeout: float = 10.0,
    ) -> None:
        self.system = system
        self.config = config
        self.workdir = workdir
        self.place = place
        self.binary = binary or tool("refsidecar")
        self.start_timeout = start_timeout
        self.log_path = workdir / "refsidecar.log"
        self.counters_path = workdir / "counters.json"
        self.process: Process | None = None
        self.counters: dict[str, Any] = {}
        self._files: list[IO[bytes]] = []

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> None:
        """Spawn it and wait until it says it listens."""
        if self.process is not None and self.process.poll() is None:
            raise RefsidecarError(f"refsidecar already running (PID {self.process.pid})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        # opened here (as root) and inherited: works whatever uid the proxy runs as
        out = open(self.counters_path, "wb")  # noqa: SIM115 - closed in stop()
        err = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._files = [out, err]
        self.process = self.system.spawn(
            self.config.argv(self.binary), place=self.place, stdout=out, stderr=err
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self.process.poll()
            if code is not None:
                self._close_files()
                raise RefsidecarError(f"refsidecar exited {code} at start: {self._log_tail()}")
            if READY in self._log():
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise RefsidecarError(
                    f"refsidecar not ready after {self.start_timeout:.0f}s: {self._log_tail()}"
                )
            time.sleep(0.02)

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _log_tail(self) -> str:
        return " | ".join(self._log().strip().splitlines()[-5:])

    def _close_files(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def stop(self) -> int | None:
        """End it (SIGTERM, then SIGKILL) and read the counters it printed."""
        code = self.process.stop(5.0) if self.process is not None else None
        self._close_files()
        if self.counters_path.exists():
            lines = self.counters_path.read_text(errors="replace").strip().splitlines()
            try:
                self.counters = dict(json.loads(lines[-1])) if lines else {}
            except (ValueError, TypeError):
                self.counters = {}
        return code
