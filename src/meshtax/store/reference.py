"""The bundled reference profile: published numbers of Zhu et al. (SoCC '23).

Labelled as published data for the paper's platform, never as a measurement of this machine.
Only the per-mode totals (one sidecar, 100 B, 30K requests/s) are available to this project,
so each mode carries one ``unattributed`` component; no size slope is published, so slopes
are zero and the profile says so.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from meshtax.model.components import UNATTRIBUTED
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import ModeProfile, Platform, Profile, Provenance
from meshtax.model.sidecar import Mode

REFERENCE_NAME = "reference"
_CROSSINGS_PER_REQUEST = 2  # request and response each cross the sidecar once


def _data() -> dict[str, Any]:
    text = resources.files("meshtax").joinpath("data/reference/zhu-socc23.yaml").read_text()
    return dict(yaml.safe_load(text))


def reference_profile() -> Profile:
    d = _data()
    rate = float(d["conditions"]["rate_rps"])
    size = float(d["conditions"]["message_bytes"])
    note = (
        f"published total per request at {size:g} B / {rate:g} rps, split evenly over request "
        "and response; slope not published (0)"
    )
    modes = []
    for mode_name, m in d["modes"].items():
        lat = float(m["total_latency_us"]) / _CROSSINGS_PER_REQUEST
        # vCPU at `rate` requests/s → CPU-µs per request → per crossing
        cpu = float(m["total_cpu_vcpu"]) / rate * 1e6 / _CROSSINGS_PER_REQUEST
        comp = ComponentModel(CostModel(lat, note=note), CostModel(cpu, note=note))
        modes.append(ModeProfile(Mode(mode_name), {UNATTRIBUTED: comp}))
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
                "Per-component breakdown (Table 2) and filter costs (Table 3) are not bundled: only per-mode totals.",
                "Size slopes are not published; the models are flat in message size.",
            ),
        ),
        modes={mp.mode: mp for mp in modes},
    )
