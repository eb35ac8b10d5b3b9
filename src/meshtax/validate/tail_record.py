"""What a topology's tail run records beside its latencies (issue #20): each service's
applications and sidecar apart, and each sidecar's connections and requests."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from meshtax.testbed.envoy.process import EnvoyProcess


def service_groups(
    pids: Mapping[str, Sequence[int]], sidecars: Collection[int]
) -> dict[str, list[int]]:
    """Per service, its pod's applications (``app:<service>``) and sidecar
    (``sidecar:<service>``), so a run's CPU says which sidecar and app carry the mesh's cost.
    Why (issue #20, set 9): Bookinfo's mesh used 2.28× the CPU per request the profile priced,
    and the record held only the five sidecars' sum."""
    out: dict[str, list[int]] = {}
    for s, ps in pids.items():
        out[f"app:{s}"] = [p for p in ps if p not in sidecars]
        out[f"sidecar:{s}"] = [p for p in ps if p in sidecars]
    return out


def connection_counters(stats: Mapping[str, int]) -> dict[str, int]:
    """An Envoy's downstream/upstream connections and requests since it started (summed over
    its HTTP connection managers and clusters; the admin listener's excluded): whether its
    traffic reuses connections — a new one per request costs a sidecar far more CPU than the
    profile's kept-alive connections."""
    want = ("downstream_cx_total", "downstream_rq_total", "upstream_cx_total", "upstream_rq_total")
    out = dict.fromkeys(want, 0)
    for k, v in stats.items():
        head, _, last = k.rpartition(".")
        if last not in out or "admin" in head:
            continue
        if (last.startswith("downstream") and head.startswith("http.")) or (
            last.startswith("upstream") and head.startswith("cluster.")
        ):
            out[last] += int(v)
    return out


def keep_counters(envoys: Mapping[str, EnvoyProcess], path: Path) -> None:
    """Each sidecar's :func:`connection_counters` at the end of the validation, to ``path``;
    a sidecar whose admin does not answer is recorded with its error, never the end of a run."""
    got: dict[str, Any] = {}
    for s, e in envoys.items():
        try:
            got[s] = connection_counters(e.stats())
        except Exception as ex:  # noqa: BLE001
            got[s] = {"error": f"{type(ex).__name__}: {ex}"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(got, indent=1))
