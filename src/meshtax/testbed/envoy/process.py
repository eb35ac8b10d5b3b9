"""A running Envoy: one wrapper for every use (a pod's sidecar, many variants in one process,
a run under callgrind), its admin interface, its version and config validation.

Every side effect goes through :class:`~meshtax.testbed.system.System`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from meshtax.testbed import procfs
from meshtax.testbed.callgrind import CallgrindDump, CallgrindSpec, parse_dump
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap
from meshtax.testbed.lifecycle import Started
from meshtax.testbed.system import CommandError, Placement, Process, System
from meshtax.testbed.tools import tool

__all__ = [
    "CALLGRIND_START_S",
    "EnvoyError",
    "EnvoyProcess",
    "START_WALL_FACTOR",
    "envoy_version",
    "parse_callgrind_total",
    "parse_stats",
    "parse_version",
    "stat_delta",
    "validate_config",
    "write_config",
]

#: Envoy takes ~20 s to start under callgrind (more with big RBAC configs); the limit is in
#: Envoy's own CPU seconds (measured with the simulators, 2026-11-26, uncapped: base 17 s, each
#: RBAC of 10 000 rules +22 s, the first Wasm VM +14 s, the microarch http set of 22 variants
#: ~100 s); twice this with the cache or branch simulator
CALLGRIND_START_S = 300.0
#: under callgrind, the wall-clock limit of a start: this many times its CPU-time limit
START_WALL_FACTOR = 6.0
# Linux caps one argv string at MAX_ARG_STRLEN (32 pages); larger bootstraps (RBAC with
# thousands of rules) go through a file instead
MAX_INLINE_CONFIG = 120_000


class EnvoyError(RuntimeError):
    """Envoy refused a config, failed to start, or its admin interface did not answer."""


def envoy_version(system: System, binary: Path | None = None) -> str:
    """Envoy's version, e.g. ``1.40.0`` (parsed from ``envoy --version``)."""
    out = system.run([str(binary or tool("envoy")), "--version"]).stdout
    return parse_version(out)


def parse_version(text: str) -> str:
    """``envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`` → ``1.40.0``."""
    for line in text.splitlines():
        if "version:" in line:
            parts = line.split("version:", 1)[1].strip().split("/")
            if len(parts) >= 2:
                return parts[1]
    raise EnvoyError(f"cannot parse Envoy version from {text!r}")


def write_config(cfg: Mapping[str, Any], path: Path) -> Path:
    """Write a bootstrap as JSON (a YAML subset Envoy reads by the ``.json`` suffix)."""
    path.write_text(json.dumps(cfg, indent=1, sort_keys=True))
    return path


def validate_config(cfg: Mapping[str, Any], system: System, binary: Path | None = None) -> None:
    """Run ``envoy --mode validate`` on ``cfg``; raise :class:`EnvoyError` with Envoy's
    message on failure."""
    with tempfile.TemporaryDirectory(prefix="meshtax-validate-") as d:
        path = write_config(cfg, Path(d) / "envoy.json")
        argv = [str(binary or tool("envoy")), "--mode", "validate", "-c", str(path), "-l", "error"]
        done = system.run(argv, check=False, timeout=60)
    if done.returncode != 0:
        msg = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise EnvoyError("invalid Envoy config: " + " | ".join(msg[-5:]))


def parse_stats(text: str) -> dict[str, int]:
    """Counters and gauges from admin ``/stats?format=json`` (histograms are skipped)."""
    out: dict[str, int] = {}
    for s in json.loads(text).get("stats", []):
        if "name" in s and isinstance(s.get("value"), int):
            out[s["name"]] = s["value"]
    return out


def stat_delta(
    before: Mapping[str, int], after: Mapping[str, int], names: Sequence[str]
) -> dict[str, int]:
    """``after - before`` for the named counters (missing counts as 0)."""
    return {n: after.get(n, 0) - before.get(n, 0) for n in names}


def parse_callgrind_total(text: str) -> int:
    """Instructions (Ir) of one callgrind dump: its ``totals:`` line (written last, complete),
    else its ``summary:`` header."""
    for key in ("totals:", "summary:"):
        for line in text.splitlines():
            if line.startswith(key) and line[len(key) :].split():
                return int(line[len(key) :].split()[0])
    raise EnvoyError("callgrind dump has no totals/summary line")


def _cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has run (every thread)."""
    return sum(procfs.schedstat(pid).values()) / 1e9


def _admin(boot: Mapping[str, Any]) -> tuple[str, int]:
    sa = boot["admin"]["address"]["socket_address"]
    return str(sa["address"]), int(sa["port_value"])


class EnvoyProcess(Started):
    """One running Envoy, placed by a :class:`Placement`; use as a context manager.

    ``config`` is a sidecar's :class:`EnvoyConfig` or a whole bootstrap (e.g. many variants,
    :func:`~meshtax.testbed.envoy.variants.multi_bootstrap`). ``callgrind`` runs it under
    ``valgrind --tool=callgrind`` (True: instructions only; a
    :class:`~meshtax.testbed.callgrind.CallgrindSpec`: with the cache and branch simulators):
    :meth:`zero` and :meth:`dump` then count the instructions of a window,
    :meth:`dump_threads` every event per thread. The admin interface is read from inside the
    placement's namespace with ``curl`` (admin listens on 127.0.0.1 only).
    """

    def __init__(
        self,
        system: System,
        config: EnvoyConfig | Mapping[str, Any],
        workdir: Path,
        place: Placement = Placement(),
        binary: Path | None = None,
        *,
        callgrind: bool | CallgrindSpec = False,
        start_timeout: float | None = None,
        cpu_s: Callable[[int], float] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.system = system
        self.cpu_s = cpu_s or _cpu_s
        self.cfg = config if isinstance(config, EnvoyConfig) else None
        self.boot: dict[str, Any] = (
            bootstrap(config) if isinstance(config, EnvoyConfig) else dict(config)
        )
        self.concurrency = self.cfg.concurrency if self.cfg is not None else 1
        self.log_level = self.cfg.log_level if self.cfg is not None else "warning"
        self.extra_args = (
            *(self.cfg.extra_args if self.cfg is not None else ()),
            *extra_args,
        )
        self.workdir = workdir
        self.place = place
        self.binary = binary or tool("envoy")
        self.callgrind_spec: CallgrindSpec | None = (
            CallgrindSpec() if callgrind is True else None if callgrind is False else callgrind
        )
        self.callgrind = self.callgrind_spec is not None
        spec = self.callgrind_spec
        # the simulators slow Envoy's start under callgrind about twice more
        slow = 2 if spec is not None and (spec.cache_sim or spec.branch_sim) else 1
        self.start_timeout = start_timeout or (slow * CALLGRIND_START_S if spec else 15.0)
        self.config_path = workdir / "envoy.json"
        self.log_path = workdir / "envoy.log"
        self.process: Process | None = None
        self._stderr: IO[bytes] | None = None
        self._bigconfig_dir: Path | None = None
        self._dumps = 0

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def config(self) -> EnvoyConfig | Mapping[str, Any]:
        """The config it was given: a sidecar's :class:`EnvoyConfig`, else the bootstrap."""
        return self.cfg if self.cfg is not None else self.boot

    @property
    def admin_url(self) -> str:
        host, port = _admin(self.boot)
        return f"http://{host}:{port}"

    def argv(self, config_file: Path | None = None) -> list[str]:
        """The command line: the bootstrap inline (or read from ``config_file``).

        ``--config-yaml`` (JSON is YAML) rather than a file, and logs to stderr rather than
        ``--log-path``: a proxy run as an unprivileged UID (Istio's 1337) can neither traverse
        a root-owned private temp dir nor create files in it; the caller opens the log for it.
        ``--disable-hot-restart``: no shared-memory region, so several Envoys on one machine
        never collide on a base id; a measured proxy is never hot-restarted.
        """
        text = json.dumps(self.boot, sort_keys=True, separators=(",", ":"))
        source = ["-c", str(config_file)] if config_file is not None else ["--config-yaml", text]
        envoy = [
            str(self.binary),
            *source,
            "--concurrency",
            str(self.concurrency),
            "--disable-hot-restart",
            "-l",
            self.log_level,
            *self.extra_args,
        ]
        if self.callgrind_spec is None:
            return envoy
        return [*self.callgrind_spec.args(self.workdir / "cg.out"), *envoy]

    def start(self) -> None:
        """Spawn Envoy (its bootstrap also saved as ``envoy.json`` for the record) and wait
        until admin ``/ready`` says LIVE."""
        if self.process is not None and self.process.poll() is None:
            # a second spawn would orphan the first: stop() only knows the newest
            raise EnvoyError(f"Envoy already running (PID {self.process.pid}); stop it first")
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_config(self.boot, self.config_path)
        # opened here (as root) and inherited: works whatever UID the proxy runs as
        self._stderr = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = self.system.spawn(
            self.argv(self._config_file_if_big()),
            place=self.place,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )
        t0 = time.monotonic()
        while True:
            code = self.process.poll()
            if code is not None:
                raise EnvoyError(f"Envoy exited {code} at start: {self._log_tail()}")
            if self._ready():
                return
            late = self._start_late(time.monotonic() - t0)
            if late:
                self.stop()
                raise EnvoyError(f"Envoy not LIVE after {late}: {self._log_tail()}")
            time.sleep(0.2 if self.callgrind else 0.05)

    def _start_late(self, wall: float) -> str | None:
        """Whether a start that has taken ``wall`` seconds is out of time (how long, said),
        else None. Plainly: ``start_timeout`` wall seconds. Under callgrind: ``start_timeout``
        seconds of Envoy's own CPU time, or :data:`START_WALL_FACTOR` times that of wall time —
        a CPU capped or shared with other work slows the start but not the work it takes (a
        22-variant Envoy on a CPU capped at 25 % for many processes was not LIVE in 600 s of
        wall time; it needs ~100 CPU-s)."""
        if not self.callgrind:
            return f"{wall:.0f}s" if wall >= self.start_timeout else None
        try:
            cpu = self.cpu_s(self.pid)
        except (procfs.ProcError, OSError, ValueError):
            cpu = wall  # not readable: wall time stands for it
        if cpu >= self.start_timeout or wall >= START_WALL_FACTOR * self.start_timeout:
            return f"{wall:.0f}s ({cpu:.0f} CPU-s)"
        return None

    def _config_file_if_big(self) -> Path | None:
        """A copy of a bootstrap too big for argv, in a fresh /tmp dir the proxy's UID owns
        (it may not traverse the caller's private workdir); removed by :meth:`stop`."""
        text = json.dumps(self.boot, sort_keys=True, separators=(",", ":"))
        if len(text) <= MAX_INLINE_CONFIG:
            return None
        d = Path(tempfile.mkdtemp(prefix="meshtax-envoy-cfg-"))
        self._bigconfig_dir = d
        path = d / "envoy.json"
        path.write_text(text)
        if self.place.uid is not None:
            gid = self.place.gid if self.place.gid is not None else self.place.uid
            for q in (d, path):
                os.chown(q, self.place.uid, gid)
        return path

    def _ready(self) -> bool:
        try:
            return self.admin_get("/ready", timeout=1.0).strip() == "LIVE"
        except EnvoyError:
            return False

    def _log_tail(self) -> str:
        if not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:])

    def admin_get(self, path: str, timeout: float = 2.0) -> str:
        """GET an admin path from inside the sidecar's namespace; raises on HTTP errors."""
        argv = ["curl", "-sS", "--fail", "--max-time", str(timeout), self.admin_url + path]
        try:
            return self.system.run(
                argv, place=Placement(netns=self.place.netns), timeout=timeout + 5
            ).stdout
        except CommandError as e:
            raise EnvoyError(f"Envoy admin {path}: {e}") from e

    def stats(self, filter: str | None = None) -> dict[str, int]:
        """Counters and gauges (``/stats?format=json``), optionally filtered by a regex."""
        q = "/stats?format=json"
        if filter:
            q += "&filter=" + filter
        return parse_stats(self.admin_get(q))

    def memory(self) -> dict[str, int]:
        """Admin ``/memory`` (tcmalloc): ``allocated``, ``heap_size``, … in bytes."""
        doc = json.loads(self.admin_get("/memory"))
        return {k: int(v) for k, v in doc.items() if str(v).isdigit()}

    def zero(self) -> None:
        """Zero callgrind's counters (the start of a counted window)."""
        self.system.run(["callgrind_control", "-z", str(self.pid)], timeout=60)

    def dump(self) -> int:
        """Dump callgrind's counters since the last zero/dump; returns the instruction count."""
        return sum(parse_callgrind_total(t) for t in self._dump().values())

    def dump_threads(self, *, functions: bool = False) -> dict[int, CallgrindDump]:
        """As :meth:`dump`, every event (and with ``functions`` each function's self cost) per
        valgrind thread number (1: the main thread); one entry, 0, unless the spec separates
        threads."""
        return {t: parse_dump(text, functions=functions) for t, text in self._dump().items()}

    def _dump(self) -> dict[int, str]:
        """Dump callgrind's counters since the last zero/dump; the dumps' texts by thread."""
        self.system.run(["callgrind_control", "-d", str(self.pid)], timeout=60)
        self._dumps += 1
        base = self.workdir / f"cg.out.{self._dumps}"
        split = self.callgrind_spec is not None and self.callgrind_spec.separate_threads
        deadline = time.monotonic() + 30
        seen: dict[int, str] = {}
        while True:
            paths = sorted(self.workdir.glob(f"{base.name}-*")) if split else [base]
            texts = {
                int(p.name.rsplit("-", 1)[1]) if split else 0: p.read_text(errors="replace")
                for p in paths
                if p.exists()
            }
            done = bool(texts) and all("totals:" in t for t in texts.values())
            if done and texts.keys() == seen.keys():
                return texts  # complete, and no thread's dump appeared since the last look
            seen = texts if done else {}
            if time.monotonic() > deadline:
                raise EnvoyError(f"callgrind wrote no complete dump {base}")
            time.sleep(0.1)

    def stop(self) -> int | None:
        """End Envoy (SIGTERM, then SIGKILL) and close the log handle."""
        timeout = 30.0 if self.callgrind else 5.0
        code = self.process.stop(timeout) if self.process is not None else None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._bigconfig_dir is not None:
            shutil.rmtree(self._bigconfig_dir, ignore_errors=True)
            self._bigconfig_dir = None
        return code
