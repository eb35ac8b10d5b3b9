"""Measure the machine's speed now: run the reference workload ``speedref`` (built from
``speedref/speedref.c`` into ``.tools/bin``) on the CPUs a measurement uses, and beside it a
reference sidecar (:func:`measure_sidecar`: Envoy as an HTTP proxy on loopback, its CPU per
request) — the user loop misses what slows a sidecar's user space (:mod:`meshtax.model.speed`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.model.speed import Speed
from meshtax.testbed import procfs
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyError, EnvoyProcess
from meshtax.testbed.fortio import FortioError, FortioServer, run_load
from meshtax.testbed.pinning import Pinning, niceness
from meshtax.testbed.system import CommandError, Placement, System, free_ports
from meshtax.testbed.tools import ToolMissing, tool

__all__ = [
    "SpeedError",
    "measure_sidecar",
    "measure_speed",
    "measure_speed_and_sidecar",
    "parse_speedref",
    "speed_on",
]

#: the reference sidecar's runs: bursts of closed-loop requests (one in flight), 100-byte bodies
SIDECAR_BURSTS = 5
SIDECAR_BURST_S = 0.6


class SpeedError(RuntimeError):
    """The reference workload failed or printed something unparseable."""


def parse_speedref(text: str, measured: str = "") -> Speed:
    """:class:`Speed` from speedref's JSON line (the fastest burst of each path)."""
    try:
        d = json.loads(text)
        return Speed(float(d["local_ns"]), float(d["cross_ns"]), float(d["user_ns"]), measured)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise SpeedError(f"unparseable speedref output {text[:200]!r}: {e}") from e


def measure_speed(
    system: System,
    cpu_a: int | None = None,
    cpu_b: int | None = None,
    *,
    roundtrips: int = 2000,
    bursts: int = 7,
    binary: Path | None = None,
) -> Speed:
    """The reference workload once (≈ 1–2 s): cross-CPU ping-pong between ``cpu_a`` and
    ``cpu_b`` (the client's and the sidecar's CPU), same-CPU ping-pong on ``cpu_b``."""
    argv = [str(binary or tool("speedref")), "-n", str(roundtrips), "-k", str(bursts)]
    if cpu_a is not None:
        argv += ["-a", str(cpu_a)]
    if cpu_b is not None:
        argv += ["-b", str(cpu_b)]
    try:
        out = system.run(argv, timeout=120).stdout
    except CommandError as e:
        raise SpeedError(str(e)) from e
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return parse_speedref(out, now)


def measure_sidecar(
    system: System,
    cpu_client: int | None = None,
    cpu_sidecar: int | None = None,
    *,
    bursts: int = SIDECAR_BURSTS,
    burst_s: float = SIDECAR_BURST_S,
) -> float:
    """A reference sidecar's CPU per request, ns: one Envoy (one worker, HTTP mode, the
    profiler's bootstrap) proxying fortio's closed-loop requests (one in flight, 100 bytes) on
    loopback to a fortio echo server; Envoy and the echo server on ``cpu_sidecar``, the client
    on ``cpu_client``. All of Envoy's threads' on-CPU time (schedstat) over each burst ÷ the
    burst's requests; the median of ``bursts`` (after a short warm-up). ≈ 2 + ``bursts`` ×
    ``burst_s`` seconds; needs no root (no namespace, no iptables)."""
    echo, admin, inbound, outbound = free_ports(4)
    side = Placement(cpus=None if cpu_sidecar is None else (cpu_sidecar,))
    client = Placement(cpus=None if cpu_client is None else (cpu_client,))
    cfg = EnvoyConfig(
        mode=Mode.HTTP,
        admin_port=admin,
        inbound_port=inbound,
        outbound_port=outbound,
        listen_address="127.0.0.1",
        inbound_upstream=("127.0.0.1", echo),
        outbound_upstream=("127.0.0.1", echo),
    )
    target = f"127.0.0.1:{outbound}"
    try:
        with (
            tempfile.TemporaryDirectory(prefix="meshtax-speed-") as d,
            FortioServer(system, Path(d) / "echo", http_port=echo, place=side),
            EnvoyProcess(system, cfg, Path(d) / "envoy", side) as envoy,
        ):
            if envoy.process is None:
                raise SpeedError("the reference sidecar did not start")
            pid = envoy.process.pid

            def cpu_ns() -> int:
                return sum(procfs.schedstat(pid).values())

            run_load(target, Mode.HTTP, 100, 0, duration_s=0.3, system=system, place=client)
            per: list[float] = []
            for _ in range(bursts):
                c0 = cpu_ns()
                r = run_load(
                    target, Mode.HTTP, 100, 0, duration_s=burst_s, system=system, place=client
                )
                c1 = cpu_ns()
                if r.count <= 0:
                    raise SpeedError("the reference sidecar served no request")
                per.append((c1 - c0) / r.count)
    except (EnvoyError, FortioError, CommandError, procfs.ProcError, OSError) as e:
        raise SpeedError(f"reference sidecar: {e}") from e
    return float(statistics.median(per))


def speed_on(
    system: System,
    pinning: Pinning,
    *,
    sidecar: bool = True,
    nice: int | None = None,
    renice: Callable[[int | None], AbstractContextManager[None]] = niceness,
) -> tuple[Speed | None, str | None]:
    """The reference workload on the CPUs a profile measured on (the client's, the first
    sidecar's), at the nice value it measured at (``nice``: :func:`~meshtax.testbed.pinning.
    nice_of`; the profiler reads its own speed inside its niced run), with the reference
    sidecar unless ``sidecar`` is false; when it cannot run, no speed and why (a prediction
    then uses the profile's costs as measured). Without root a process cannot lower its nice
    value: the reading is then taken at this process's own."""
    if nice is not None and os.geteuid() != 0 and nice < os.getpriority(os.PRIO_PROCESS, 0):
        nice = None
    a = pinning.client[0] if pinning.client else None
    b = pinning.sidecars[0] if pinning.sidecars else None
    try:
        with renice(nice):
            return (measure_speed_and_sidecar if sidecar else measure_speed)(system, a, b), None
    except (SpeedError, ToolMissing) as e:
        return None, f"machine speed not measured ({e}): the profile's costs used as measured"


def measure_speed_and_sidecar(system: System, cpu_a: int | None, cpu_b: int | None) -> Speed:
    """:func:`measure_speed` and :func:`measure_sidecar` on the same CPUs (the profiler's
    speed gauge)."""
    s = measure_speed(system, cpu_a, cpu_b)
    return dataclasses.replace(s, sidecar_ns=measure_sidecar(system, cpu_a, cpu_b))
