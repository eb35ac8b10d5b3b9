"""Sidecar memory per pod from the ECG's connection counts (pure)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshtax.model.ecg import Service
from meshtax.model.profile import Profile


def memory_by_service(
    services: Mapping[str, Service], profiles: Callable[[str | None], Profile]
) -> tuple[dict[str, Any] | None, list[str]]:
    """Resident memory of each meshed service's sidecar (``M + n·m`` at its connection count).

    Returns None when no service gives a connection count; warnings name services whose
    profile has no memory model for their mode (plaintext or mTLS).
    """
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    for name, svc in sorted(services.items()):
        if not svc.sidecar.meshed or svc.connections is None:
            continue
        prof = profiles(svc.platform)
        mp = prof.modes.get(svc.sidecar.mode)
        model = None if mp is None else (mp.memory_mtls if svc.sidecar.mtls else mp.memory)
        if model is None:
            warnings.append(
                f"profile {prof.name!r} has no "
                f"{svc.sidecar.mode.value}{' mTLS' if svc.sidecar.mtls else ''} memory model: "
                f"memory of {name!r} not predicted"
            )
            continue
        b = float(model.predict([svc.connections])[0])
        se = float(model.stderr_at([svc.connections])[0])
        rows.append(
            {
                "service": name,
                "connections": svc.connections,
                "bytes": b,
                "bytes_lo": b - 1.96 * se,
                "bytes_hi": b + 1.96 * se,
            }
        )
    if not rows:
        return None, warnings
    return {"per_pod": rows, "total_bytes": sum(r["bytes"] for r in rows)}, warnings
