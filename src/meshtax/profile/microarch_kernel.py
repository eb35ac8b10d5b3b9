"""Kernel work per request for the microarchitectural profile, from the base profile's own
measurements (not re-measured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshtax.model.microarch import KernelRow

__all__ = ["kernel_rows"]


def kernel_rows(measurements: Mapping[str, Any]) -> list[KernelRow]:
    """Per mode and size, the sidecar's syscalls and CPU per request, pooled over the meshed
    probe windows of a profile's ``options.measurements`` (its worker threads: those that read
    or wrote), and the kernel/user split of its perf run at the highest rate (per crossing in
    the record, so doubled); empty when the profile has no such record."""
    rows = []
    for mode, records in measurements.items():
        for r in records or ():
            ws = [w for w in r.get("probe", {}).get("windows", ()) if w.get("meshed")]
            n = sum(int(w.get("requests", 0)) for w in ws)
            if not ws or n <= 0:
                continue

            def tot(key: str, ws: list[dict[str, Any]] = ws) -> float:
                return float(sum(w.get("sidecar", {}).get(key, 0) for w in ws))

            cpu = max(r.get("cpu") or [{}], key=lambda c: (c.get("run") == "max", c.get("rate", 0)))
            bd = cpu.get("breakdown_us")
            rows.append(
                KernelRow(
                    str(mode),
                    int(r["size"]),
                    n,
                    tot("syscalls") / n,
                    tot("read_n") / n,
                    tot("write_n") / n,
                    tot("epoll_n") / n,
                    tot("sys_cpu_ns") / n / 1e3,
                    tot("user_ns") / n / 1e3,
                    None if bd is None else 2 * sum(v for k, v in bd.items() if k != "user"),
                    None if bd is None else 2 * bd.get("user", 0.0),
                    str(cpu.get("run", "")),
                )
            )
    return rows
