"""A proxy configured by one file (HAProxy, nginx) as a testbed process: the config is checked
by the binary itself, written to the proxy's work directory, and the proxy runs in the
foreground, single-process, until it listens on its ports.

Every side effect goes through :class:`~meshtax.testbed.system.System` (the readiness check
reads ``/proc/PID/net/tcp``; ``proc`` points tests at a fake tree).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Protocol

from meshtax.testbed.lifecycle import Started
from meshtax.testbed.procfs import PROC, listening_ports
from meshtax.testbed.system import Placement, Process, System

__all__ = ["FileConfig", "FileProxy", "FileProxyError"]


class FileProxyError(RuntimeError):
    """The proxy refused its config, exited at start, or never listened."""


class FileConfig(Protocol):
    """What :class:`FileProxy` needs of a proxy's config (pure)."""

    @property
    def name(self) -> str:
        """The proxy's name, for messages and file names."""
        ...

    def render(self, workdir: Path) -> str:
        """The config file's text (paths it writes live under ``workdir``)."""
        ...

    def argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        """The command line that runs it in the foreground."""
        ...

    def check_argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        """The command line that only checks the config."""
        ...

    def ports(self) -> tuple[int, ...]:
        """The ports it listens on once ready."""
        ...


class FileProxy(Started):
    """One running file-configured proxy, placed by a :class:`Placement`; use as a context
    manager. The work directory is handed to the placement's uid (the proxy writes its pid
    file, temp files and logs there); stderr goes to ``<name>.stderr``."""

    def __init__(
        self,
        system: System,
        config: FileConfig,
        workdir: Path,
        place: Placement = Placement(),
        binary: Path | None = None,
        *,
        start_timeout: float = 10.0,
        proc: Path = PROC,
    ) -> None:
        self.system = system
        self.config = config
        self.workdir = workdir
        self.place = place
        self.binary = binary or Path(config.name)
        self.start_timeout = start_timeout
        self.proc = proc
        self.conf_path = workdir / f"{config.name}.conf"
        self.log_path = workdir / f"{config.name}.stderr"
        self.process: Process | None = None
        self._files: list[IO[bytes]] = []

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> None:
        """Check the config with the binary, spawn it and wait until it listens."""
        if self.process is not None and self.process.poll() is None:
            raise FileProxyError(f"{self.config.name} already running (PID {self.process.pid})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(self.config.render(self.workdir))
        if self.place.uid is not None:
            gid = self.place.gid if self.place.gid is not None else self.place.uid
            self.system.run(["chown", "-R", f"{self.place.uid}:{gid}", str(self.workdir)])
        check = self.config.check_argv(self.binary, self.conf_path, self.workdir)
        # checked as it will run (same uid and namespace: the files it opens are its own)
        done = self.system.run(check, place=self.place, check=False, timeout=30)
        if done.returncode != 0:
            msg = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise FileProxyError(f"{self.config.name} refused its config: {' | '.join(msg[-4:])}")
        err = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._files = [err]
        argv = self.config.argv(self.binary, self.conf_path, self.workdir)
        self.process = self.system.spawn(argv, place=self.place, stdout=err, stderr=err)
        want = set(self.config.ports())
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self.process.poll()
            if code is not None:
                self._close_files()
                raise FileProxyError(
                    f"{self.config.name} exited {code} at start: {self._log_tail()}"
                )
            if want <= listening_ports(self.process.pid, self.proc):
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise FileProxyError(
                    f"{self.config.name} not listening on {sorted(want)} after "
                    f"{self.start_timeout:.0f}s: {self._log_tail()}"
                )
            time.sleep(0.02)

    def _log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return " | ".join(text.strip().splitlines()[-5:])

    def _close_files(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def stop(self) -> int | None:
        """End it (SIGTERM, then SIGKILL)."""
        code = self.process.stop(5.0) if self.process is not None else None
        self._close_files()
        return code
