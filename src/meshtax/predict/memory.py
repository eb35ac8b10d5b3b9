"""Proxy memory from the ECG's connection counts (pure): per sidecar, and per architecture."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshtax.model.ecg import Service
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Architecture, Mode
from meshtax.predict.architecture import architecture_of, place_nodes


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


def memory_by_architecture(
    services: Mapping[str, Service],
    profiles: Callable[[str | None], Profile],
    architecture: Architecture | str,
    pods_per_node: int = 1,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Resident memory of every proxy ``architecture`` runs for ``services``: a sidecar per
    sidecar service (its mode's model at its connections), a node proxy per node with a
    node-l4 or waypoint service (the tcp-mode model at the connections of the node's
    services: every connection of a pod goes through its node's proxy), and a waypoint per
    waypoint service (its mode's model at its connections). Services without a connection
    count count 0 connections. None (with a warning) when a proxy's model is missing."""
    default = Architecture(architecture)
    arch = {n: architecture_of(s.sidecar, s.architecture, default) for n, s in services.items()}
    nodes = place_nodes(services, {n: s.node for n, s in services.items()}, pods_per_node)
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []

    def price(proxy: str, svc: Service, mode: Mode, mtls: bool, conns: int) -> None:
        prof = profiles(svc.platform)
        mp = prof.modes.get(mode)
        model = None if mp is None else (mp.memory_mtls if mtls else mp.memory)
        if model is None:
            role = proxy.rsplit(" ", 1)[0]
            warnings.append(
                f"profile {prof.name!r} has no {mode.value}{' mTLS' if mtls else ''} memory "
                f"model: {role} memory under {default.value} not predicted "
                "(`meshtax profile --memory`)"
            )
            return
        b = float(model.predict([conns])[0])
        rows.append({"proxy": proxy, "connections": conns, "bytes": b})

    on_node: dict[str, list[str]] = {}
    for name, svc in sorted(services.items()):
        a = arch[name]
        conns = svc.connections or 0
        if a is Architecture.SIDECAR:
            price(f"sidecar {name}", svc, svc.sidecar.mode, svc.sidecar.mtls, conns)
        elif a is not Architecture.NONE:
            on_node.setdefault(nodes[name], []).append(name)
            if a is Architecture.WAYPOINT:
                price(f"waypoint {name}", svc, svc.sidecar.mode, svc.sidecar.mtls, conns)
    for node, names in sorted(on_node.items()):
        first = services[names[0]]  # the node proxy is priced from its first service's profile
        mtls = any(services[n].sidecar.mtls for n in names)
        conns = sum(services[n].connections or 0 for n in names)
        price(f"node proxy {node}", first, Mode.TCP, mtls, conns)
    if warnings:
        return None, list(dict.fromkeys(warnings))
    return {
        "architecture": default.value,
        "proxies": len(rows),
        "per_proxy": rows,
        "total_bytes": sum(r["bytes"] for r in rows),
    }, warnings
