"""Measure the machine's speed now: run the reference workload ``speedref`` (built from
``speedref/speedref.c`` into ``.tools/bin``) on the CPUs a measurement uses."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from meshtax.model.speed import Speed
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.system import CommandError, System
from meshtax.testbed.tools import ToolMissing, tool

__all__ = ["SpeedError", "measure_speed", "parse_speedref", "speed_on"]


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


def speed_on(system: System, pinning: Pinning) -> tuple[Speed | None, str | None]:
    """The reference workload on the CPUs a profile measured on (the client's, the first
    sidecar's); when it cannot run, no speed and why (a prediction then uses the profile's
    costs as measured)."""
    a = pinning.client[0] if pinning.client else None
    b = pinning.sidecars[0] if pinning.sidecars else None
    try:
        return measure_speed(system, a, b), None
    except (SpeedError, ToolMissing) as e:
        return None, f"machine speed not measured ({e}): the profile's costs used as measured"
