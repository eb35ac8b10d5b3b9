"""Many sidecars in one Envoy: one loopback listener per *variant* (its own filter chain, or
TLS), each forwarding to its own copy of a cluster. With ``--concurrency 1`` one worker thread
serves them all, so "with minus without" compares the same process and thread.

Each variant is built from the profiled sidecar's own bootstrap
(:func:`~meshtax.testbed.envoy.config.bootstrap`, inbound side), so a variant's work is exactly
the sidecar's plus its filters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap
from meshtax.testbed.envoy.filters import (
    PARAMS,
    FilterSpec,
    combination,
    filter_config,
    parse_component,
)

__all__ = [
    "BASE",
    "LO",
    "QUIET_ARGS",
    "QUIET_TIMERS",
    "Variant",
    "filter_variants",
    "multi_bootstrap",
    "variant",
]

BASE = "base"
LO = "127.0.0.1"


@dataclass(frozen=True)
class Variant:
    """One listener (its filter chain) and the cluster it forwards to, named ``name``."""

    name: str
    port: int
    listener: Mapping[str, Any]
    cluster: Mapping[str, Any]
    outputs: tuple[str, ...] = ()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def variant(
    name: str,
    mode: Mode,
    port: int,
    upstream: tuple[str, int],
    spec: FilterSpec | None = None,
    *,
    listener_tls: Mapping[str, Any] | None = None,
    cluster_tls: Mapping[str, Any] | None = None,
) -> Variant:
    """A listener on ``127.0.0.1:port`` in ``mode`` with ``spec``'s filters, forwarding to ``upstream``.

    Built from the profiler's own sidecar config (:func:`~meshtax.testbed.envoy.config.bootstrap`
    of the inbound side), so a variant's work is exactly the profiled sidecar's plus its filters.
    """
    cfg = EnvoyConfig(
        mode=mode,
        listen_address=LO,
        inbound_port=port,
        inbound_upstream=upstream,
        inbound_tls=listener_tls,
    )
    if spec is not None:
        cfg = spec.apply(cfg)
    boot = bootstrap(cfg)
    listener = next(x for x in boot["static_resources"]["listeners"] if x["name"] == "inbound")
    cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "inbound_static")
    cname = f"c_{_slug(name)}"
    # the cluster name appears only as a JSON string value: rename it everywhere at once
    text = json.dumps(listener).replace('"inbound_static"', json.dumps(cname))
    lst = json.loads(text)
    lst["name"] = f"l_{_slug(name)}"
    cl = json.loads(json.dumps(cluster))
    cl["name"] = cname
    cl["load_assignment"]["cluster_name"] = cname
    if cluster_tls is not None:
        cl["transport_socket"] = json.loads(json.dumps(cluster_tls))
    return Variant(name, port, lst, cl, spec.outputs if spec is not None else ())


_QUIET_DOG = {"miss_timeout": "60s", "megamiss_timeout": "60s"}
#: bootstrap fields of an Envoy whose events are counted per request: no periodic stats flush
#: (every 5 s: the main thread walks every stat and has each worker merge its histograms)
#: and the watchdogs' loop every minute rather than every 200 ms. Both run on a wall-time
#: clock, not per request; under valgrind they also evict the worker's lines from the one
#: simulated cache all threads share (BENCHMARKS.md, issue #19: the D1 misses of TCP mode).
QUIET_TIMERS: Mapping[str, Any] = {
    "stats_flush_on_admin": True,
    "watchdogs": {"main_thread_watchdog": _QUIET_DOG, "worker_watchdog": _QUIET_DOG},
}
#: command-line options of such an Envoy: file access logs flush by size only (64 KiB,
#: Envoy's default), their timer (10 s by default, a command-line option) put at an hour. At
#: native speed a one-connection proxy fills 64 KiB of log lines long before 10 s; under
#: valgrind (~90 gRPC requests a second) in ~3 s, so the timer would cut every third or fourth
#: buffer short at a point of wall time, and which window of a pair a flush (and the log
#: buffer's fresh memory) lands in would follow the clock, not the requests.
QUIET_ARGS: tuple[str, ...] = ("--file-flush-interval-msec", "3600000")


def multi_bootstrap(
    variants: Sequence[Variant], admin_port: int, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One bootstrap serving every variant (names and ports must be distinct); ``extra``:
    top-level bootstrap fields added (e.g. :data:`QUIET_TIMERS`)."""
    names = [v.name for v in variants]
    ports = [v.port for v in variants]
    if len(set(names)) != len(names) or len(set(ports)) != len(ports) or admin_port in ports:
        raise ValueError("variant names and ports (and the admin port) must be distinct")
    return {
        "node": {"id": "meshtax-filterprof", "cluster": "meshtax"},
        "admin": {"address": {"socket_address": {"address": LO, "port_value": admin_port}}},
        "static_resources": {
            "listeners": [dict(v.listener) for v in variants],
            "clusters": [dict(v.cluster) for v in variants],
        },
        **json.loads(json.dumps(extra or {})),
    }


def filter_variants(
    mode: Mode,
    components: Sequence[str],
    ports: Sequence[int],
    echo: tuple[str, int],
    *,
    combos: Mapping[str, Sequence[str]] | None = None,
    outdir: Path | None = None,
    params: Mapping[str, Any] | None = None,
) -> list[Variant]:
    """``base``, then one variant per component, then one per combination (``ports`` in order).

    ``outdir``: where tap and access-log files go (else the catalogue's defaults under /tmp).
    ``params``: extra filter parameters (e.g. ``module=`` bytes for wasm).
    """
    extra = dict(params or {})
    if outdir is not None:
        extra.setdefault("path_prefix", str(outdir / "tap" / "tap"))
        extra.setdefault("path", str(outdir / "access.log"))
    combos = dict(combos or {})
    need = 1 + len(components) + len(combos)
    if len(ports) < need:
        raise ValueError(f"need {need} ports, got {len(ports)}")
    out = [variant(BASE, mode, ports[0], echo)]
    for i, c in enumerate(components, 1):
        base, sized = parse_component(c)
        own = {k: v for k, v in extra.items() if k in PARAMS[base]}
        out.append(variant(c, mode, ports[i], echo, filter_config(base, mode, **own, **sized)))
    for j, (name, members) in enumerate(combos.items(), 1 + len(components)):
        out.append(variant(name, mode, ports[j], echo, combination(members, mode, name, **extra)))
    return out
