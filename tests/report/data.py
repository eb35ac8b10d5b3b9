"""Deterministic report inputs: synthetic profiles (fitted on made-up samples), predictions of
the bundled example graphs, many random graphs, a validation and a study document."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.model.components import Component, Kind
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import BatchBuilder, to_batch
from meshtax.model.profile import Closure, ModeProfile, Platform, Profile, Provenance
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.predict.whatif import apply_speedup, speedup_from_dict
from meshtax.report.result import prediction_document
from meshtax.traces.ecg_file import load_ecg_file

CREATED = "2026-01-02T03:04:05+00:00"
PLATFORM = Platform("Test CPU @ 2.0GHz", 2, "6.18.0", "envoy", "1.40.0")
HOST = Platform("Another CPU", 4, "6.1.0")

# (latency µs per message at 0 B, µs per byte, CPU-µs per message, CPU-µs per byte) — the
# paper's Table 2 proportions, halved to one direction
_BASE = {
    Kind.IPC: (2.0, 0.0004, 4.0, 0.0006),
    Kind.READ: (1.5, 0.0002, 3.0, 0.0004),
    Kind.WRITE: (3.0, 0.0003, 5.0, 0.0005),
    Kind.NOTIFICATION: (4.0, 0.0, 2.0, 0.0),
    Kind.PARSING: (12.0, 0.001, 20.0, 0.0015),
    Kind.OTHER: (8.0, 0.0001, 14.0, 0.0002),
}
_FILTERS = {"lua": (9.0, 20.0), "rbac": (1.5, 3.0), "tap": (4.0, 7.0)}
SIZES = (100.0, 1000.0, 4000.0, 16000.0, 65536.0)
RATES = (5000.0, 15000.0, 30000.0)


def _fit(rng: np.random.Generator, a: float, b: float, noise: float, with_rates: bool) -> CostModel:
    sizes, rates, values = [], [], []
    for s in SIZES:
        for r in RATES if with_rates else (30000.0,):
            sizes.append(s)
            rates.append(r)
            values.append((a + b * s) * (1 + noise * rng.standard_normal()))
    return CostModel.fit(sizes, values, rates=rates if with_rates else None, split_bytes=16384)


def measured_profile(name: str = "this-host", seed: int = 1, scale: float = 1.0) -> Profile:
    """A measured-looking profile: tcp/http/grpc, every component fitted on noisy samples,
    three filters in http and grpc, closures."""
    rng = np.random.default_rng(seed)
    modes = []
    for mode in (Mode.TCP, Mode.HTTP, Mode.GRPC):
        comps: dict[Component, ComponentModel] = {}
        for kind, (la, lb, ca, cb) in _BASE.items():
            if kind is Kind.PARSING and mode is Mode.TCP:
                continue
            f = scale * (1.15 if mode is Mode.GRPC else 1.0)
            comps[Component(kind)] = ComponentModel(
                _fit(rng, la * f, lb * f, 0.04, False), _fit(rng, ca * f, cb * f, 0.04, True)
            )
        if mode is not Mode.TCP:
            for fname, (lat, cpu) in _FILTERS.items():
                comps[Component(Kind.FILTER, fname)] = ComponentModel(
                    _fit(rng, lat * scale, 0.0, 0.05, False),
                    _fit(rng, cpu * scale, 0.0, 0.05, False),
                )
        total = 2 * sum(
            float(m.latency.predict(np.array([100.0]))[0]) for c, m in comps.items() if not c.name
        )
        modes.append(
            ModeProfile(mode, comps, Closure(total * 1.04, total * 0.98, total * 1.1, total, 0.1))
        )
    prov = Provenance(
        "measured",
        "meshtax test fixture",
        "2026-01-01T00:00:00+00:00",
        "0.1.0",
        {"quick": True},
        ("synthetic samples",),
    )
    return Profile(name, PLATFORM, prov, {m.mode: m for m in modes})


def golden_profile() -> Profile:
    """Round numbers only (no least-squares noise), so golden files are exact on any machine."""
    comps = {
        Component(Kind.IPC): ComponentModel(CostModel(2.5, 0.001), CostModel(4.0, 0.002)),
        Component(Kind.READ): ComponentModel(CostModel(1.5, 0.0005), CostModel(3.0)),
        Component(Kind.WRITE): ComponentModel(
            CostModel(3.0, 0.0005, split_bytes=16384, per_unit=1.0), CostModel(5.0)
        ),
        Component(Kind.PARSING): ComponentModel(CostModel(12.0, 0.002), CostModel(20.0, 0.004)),
        Component(Kind.OTHER): ComponentModel(CostModel(8.0), CostModel(14.0)),
        Component(Kind.FILTER, "lua"): ComponentModel(CostModel(9.0), CostModel(20.0)),
    }
    tcp = {c: m for c, m in comps.items() if c.kind not in (Kind.PARSING, Kind.FILTER)}
    prov = Provenance("measured", "golden fixture", "2026-01-01T00:00:00+00:00", "0.1.0", {}, ())
    return Profile(
        "golden",
        PLATFORM,
        prov,
        {
            Mode.TCP: ModeProfile(Mode.TCP, tcp, Closure(30.0, 28.0, 32.0, 30.5, 0.1)),
            Mode.HTTP: ModeProfile(Mode.HTTP, comps),
            Mode.GRPC: ModeProfile(Mode.GRPC, comps),
        },
    )


def example_paths() -> list[Path]:
    d = resources.files("meshtax") / "data" / "examples"
    return sorted(
        Path(str(p))
        for p in d.iterdir()
        if p.name.endswith(".yaml") and not p.name.startswith("speedup")
    )


SPEEDUP = {
    "name": "paper-optimizations",
    "scale": {"ipc": "-30%", "write": "-50%", "parsing": "-20%"},
}


def prediction(
    profile: Profile,
    paths: list[Path] | None = None,
    *,
    whatif: bool = True,
    label: str | None = None,
) -> dict[str, Any]:
    ecgs = [e for p in (paths or example_paths()) for e in load_ecg_file(str(p))]
    batch = to_batch(ecgs)
    bp = predict_batch(batch, single_profile(profile))
    wi = None
    if whatif:
        sp = speedup_from_dict(SPEEDUP)
        after, _ = apply_speedup(profile, sp)
        wi = (sp.describe(), predict_batch(batch, single_profile(after)), after)
    doc = prediction_document(
        batch,
        bp,
        profile,
        host=HOST,
        options={"ecg_files": [p.name for p in (paths or example_paths())]},
        whatif=wi,
        created=CREATED,
    )
    if label:
        doc["label"] = label
    return doc


def many_graphs(
    profile: Profile, n: int, config: SidecarConfig, seed: int, label: str
) -> dict[str, Any]:
    """``n`` random call trees (depth ≤ 4, fan-out 1–4) under one sidecar configuration."""
    rng = np.random.default_rng(seed)
    b = BatchBuilder()
    svcs = [b.service(f"s{i}", config) for i in range(30)]
    for g in range(n):
        rows: list[tuple[int, int, int, float, float, float, float, float]] = []

        def grow(parent: int, caller: int, depth: int, start: float, dur: float) -> None:
            me = len(rows)  # noqa: B023
            callee = svcs[int(rng.integers(len(svcs)))]
            rows.append(  # noqa: B023
                (
                    parent,
                    caller,
                    callee,
                    float(rng.choice([100, 500, 2000])),
                    float(rng.choice([200, 1000, 8000])),
                    1000.0,
                    start,
                    dur,
                )
            )
            if depth < 4 and rng.random() < 0.7:
                k = int(rng.integers(1, 5))
                t = start + 0.05 * dur
                for _ in range(k):
                    d = dur * float(rng.uniform(0.1, 0.8)) / k
                    grow(me, callee, depth + 1, t, d)
                    t += d * float(rng.choice([0.2, 1.05]))  # some parallel, some sequential

        grow(-1, -1, 0, 0.0, float(rng.lognormal(8.0, 0.6)))
        b.add_graph(f"g{g}", rows)
    batch = b.build()
    bp = predict_batch(batch, single_profile(profile))
    doc = prediction_document(batch, bp, profile, host=HOST, options={"graphs": n}, created=CREATED)
    doc["label"] = label
    return doc


def validation_doc() -> dict[str, Any]:
    cases = []
    for i, q in enumerate(("boutique-index", "boutique-browse", "hotel-search")):
        for mode in ("http", "grpc"):
            m = 900.0 + 150 * i + (200 if mode == "grpc" else 0)
            cases.append(
                {
                    "name": q,
                    "mode": mode,
                    "latency": {
                        "predicted": m * (1.05 - 0.04 * i),
                        "measured": m,
                        "lo": m * 0.95,
                        "hi": m * 1.06,
                    },
                    "cpu": {"predicted": 1.2 + 0.1 * i, "measured": 1.25 + 0.08 * i},
                }
            )
    return {"format": "meshtax-validation/1", "name": "synthetic validation", "cases": cases}


def study_doc(seed: int = 3) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "format": "meshtax-study/1",
        "name": "synthetic study",
        "configurations": {
            "study tcp": {
                "latency_overhead_pct": list(rng.lognormal(1.5, 0.6, 500)),
                "cpu_vcpu": list(rng.lognormal(-1.0, 0.8, 500)),
            },
        },
    }
