"""The bundled reference profile: published numbers of Zhu et al. (SoCC '23).

Labelled as published data for the paper's platform, never as a measurement of this machine.
Table 2 gives six components per mode (IPC, Read, Write, Notification, Parsing, Other) and
Table 3 five filters in HTTP mode, all per request through one sidecar at 100 B and 30K
requests/s. meshtax models are per crossing, so each published value is split evenly over the
request and the response (two crossings); CPU in vCPU at 30K/s becomes CPU-µs per message. No
size slope is published, so every model is flat in message size and says so.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from meshtax.model.components import PARSING, Component, filter_component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import ModeProfile, Platform, Profile, Provenance
from meshtax.model.sidecar import Mode

__all__ = ["REFERENCE_NAME", "published_whatif", "reference_data", "reference_profile"]

REFERENCE_NAME = "reference"
_CROSSINGS_PER_REQUEST = 2  # request and response each cross the sidecar once
_FILTER_MODE = Mode.HTTP  # Table 3 was measured on an HTTP-mode sidecar


def reference_data() -> dict[str, Any]:
    """The bundled transcription of the paper's tables (``data/reference/zhu-socc23.yaml``)."""
    text = resources.files("meshtax").joinpath("data/reference/zhu-socc23.yaml").read_text()
    return dict(yaml.safe_load(text))


def published_whatif() -> dict[str, Any]:
    """Section 6.2 (Figures 13/14): the paper's Unix-socket and zero-copy what-if numbers."""
    return dict(reference_data()["whatif_alibaba"])


def _model(lat_us: float, vcpu: float, rate: float, what: str) -> ComponentModel:
    """Per-crossing flat models from a per-request latency (µs) and CPU (vCPU at ``rate``)."""
    note = f"{what}; per request split evenly over request and response; slope not published (0)"
    lat = lat_us / _CROSSINGS_PER_REQUEST
    cpu = vcpu / rate * 1e6 / _CROSSINGS_PER_REQUEST  # vCPU → CPU-µs per request → crossing
    return ComponentModel(CostModel(lat, note=note), CostModel(cpu, note=note))


def reference_profile() -> Profile:
    d = reference_data()
    rate = float(d["conditions"]["rate_rps"])
    size = float(d["conditions"]["message_bytes"])
    at = f"{size:g} B / {rate:g} rps"
    lat_t, cpu_t = d["table2"]["latency_us"], d["table2"]["cpu_vcpu"]
    modes: dict[Mode, ModeProfile] = {}
    for mode_name in lat_t:
        mode = Mode(mode_name)
        lat, cpu = dict(lat_t[mode_name]), dict(cpu_t[mode_name])
        total_lat, total_cpu = float(lat.pop("total")), float(cpu.pop("total"))
        if set(lat) != set(cpu):
            raise ValueError(f"reference data: {mode_name} latency and CPU name other components")
        if abs(sum(lat.values()) - total_lat) > 1e-9 or abs(sum(cpu.values()) - total_cpu) > 1e-9:
            raise ValueError(f"reference data: {mode_name} components do not sum to the total")
        comps = {
            Component.parse(k): _model(float(lat[k]), float(cpu[k]), rate, f"Table 2 at {at}")
            for k in lat
        }
        # parsing is "—" in TCP mode: zero, as a measured tcp-mode profile records it
        comps.setdefault(PARSING, _model(0.0, 0.0, rate, "Table 2: no parsing in this mode"))
        if mode is _FILTER_MODE:
            for f in d["table3"].values():
                comps[filter_component(str(f["component"]))] = _model(
                    float(f["latency_us"]), float(f["cpu_vcpu"]), rate, f"Table 3 at {at}"
                )
        modes[mode] = ModeProfile(mode, comps)
    p = d["platform"]
    return Profile(
        name=REFERENCE_NAME,
        platform=Platform(
            str(p["cpu_model"]), int(p["cores"]), str(p["kernel"]), "envoy", str(p["proxy_version"])
        ),
        provenance=Provenance(
            source="published",
            by=str(d["source"]),
            created="2023-10-30",
            options={"message_bytes": size, "rate_rps": rate},
            notes=(
                "Published data for the paper's platform, not a measurement of this machine.",
                "Table 2: six components per mode, per request through one sidecar, split "
                "evenly over request and response.",
                "Table 3 filters, HTTP mode only: fault injection → filter:fault_injection, "
                "local rate limit → filter:rate_limit, tap to file → filter:tap, no-op Lua → "
                "filter:lua, no-op Wasm → filter:wasm.",
                "Size slopes are not published; the models are flat in message size.",
            ),
        ),
        modes=modes,
    )
