"""The what-if study (the paper's Figures 13/14): derived speedup files applied over generated
call graphs, reductions with exact expectations where the study is linear (CPU), and the
paper's numbers beside them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from meshtax.app.whatif import WhatifStudyOptions, published_for, whatif_study
from meshtax.model.components import IPC, NOTIFICATION, OTHER, READ, WRITE
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.whatif import Z95, derive_speedup
from meshtax.store.sqlite import ProfileStore
from meshtax.traces import AlibabaOptions, generate, ingest
from tests.helpers import profile

SIZES = [100, 100, 4096, 4096]


def fitted(lat: list[float], cpu: list[float]) -> ComponentModel:
    return ComponentModel(CostModel.fit(SIZES, lat), CostModel.fit(SIZES, cpu))


FLAT = {c: fitted([4, 4, 4, 4], [3, 3, 3, 3]) for c in (READ, WRITE, NOTIFICATION, OTHER)}
BASE = profile({Mode.TCP: {IPC: fitted([10, 12, 10, 12], [8, 8, 8, 8]), **FLAT}}, "base")
# only IPC changes: half the latency (with scatter, so it has an interval), 3/4 of the CPU
UDS = profile({Mode.TCP: {IPC: fitted([5, 6, 4, 7], [6, 5.5, 6, 6.5]), **FLAT}}, "uds")


@pytest.fixture(scope="module")
def trace_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("traces")
    generate(40, 3, "alibaba-v2021", d / "g.csv")
    opts = AlibabaOptions(request_bytes=100, response_bytes=100, sidecar=SidecarConfig(Mode.TCP))
    ingest([str(d / "g.csv")], str(d / "store"), "alibaba-v2021", opts, progress=False)
    return str(d / "store")


def test_study_applies_the_derived_file_and_gives_exact_cpu_reduction(
    trace_store: str, tmp_path: Path
) -> None:
    db = ProfileStore(str(tmp_path / "p.db"))
    db.save(BASE)
    db.save(UDS)
    opts = WhatifStudyOptions({100: trace_store}, "base", {"uds": "uds"}, str(tmp_path / "out"))
    doc = whatif_study(opts, db)
    assert doc["format"] == "meshtax-whatif-study/1" and doc["base_profile"] == "base"
    (at,) = doc["sizes"]
    assert at["size"] == 100 and at["graphs"] == 40
    (v,) = at["variants"]
    # the speedup file on disk is the derivation's document at 100 B
    written = yaml.safe_load(Path(v["speedup_file"]).read_text())
    expected = derive_speedup(BASE, UDS, (100.0,)).document(name="uds-100B")
    assert written == json.loads(json.dumps(expected))
    assert set(written["modes"]["tcp"]) == {"ipc"}
    # CPU is linear in the components: the saving is IPC's share times (1 − its ratio)
    ratio = next(x for x in v["ratios"] if x["component"] == "ipc" and x["metric"] == "cpu")
    assert ratio["ratio"] == pytest.approx(5.75 / 8)  # the fit passes through the 100 B mean
    share = 8.0 / (8.0 + 4 * 3.0)
    red = v["reduction_pct"]["cpu"]
    assert red["value"] == pytest.approx(100 * (1 - ratio["ratio"]) * share, rel=1e-9)
    se = (ratio["hi"] - ratio["ratio"]) / Z95
    assert red["se"] == pytest.approx(100 * share * se, rel=1e-6)
    assert (red["lo"], red["hi"]) == pytest.approx(
        (red["value"] - Z95 * red["se"], red["value"] + Z95 * red["se"])
    )
    # latency: IPC halves, so every hop's cost falls by IPC's share / 2; a graph's overhead
    # (a longest path, convex in the hop costs) falls at least that much
    lat = v["reduction_pct"]["latency"]
    ipc_share = 11.0 / (11.0 + 4 * 4.0)
    assert 100 * 0.5 * ipc_share - 1e-9 <= lat["value"] < 100 and lat["lo"] < lat["value"]
    # before/after summaries and CDF quantiles, monotone
    b, a = at["baseline"]["cpu_vcpu"], v["cpu_vcpu"]
    assert a["mean"] == pytest.approx(b["mean"] * (1 - red["value"] / 100))
    assert len(b["quantiles"]) == 201 and b["quantiles"] == sorted(b["quantiles"])
    assert v["published"]["headline_latency_pct"] == 27.0
    assert (tmp_path / "out" / "whatif-study.json").is_file()


def test_published_numbers_per_variant_and_size() -> None:
    uds = published_for("uds", 100)
    assert uds is not None
    assert (uds["headline_latency_pct"], uds["headline_cpu_pct"]) == (27.0, 18.0)
    assert uds["latency_pct"] == pytest.approx(100 * 0.71 / 2.88)
    assert uds["cpu_pct"] == pytest.approx(100 * (1 - 71 / 86))
    uds4k = published_for("uds", 4096)
    assert uds4k is not None and uds4k["cpu_pct"] == pytest.approx(100 * (1 - 91 / 107))
    zc = published_for("zerocopy", 100)
    assert zc is not None and "negligible" in zc["summary"] and "latency_pct" not in zc
    assert math.isclose(zc["cpu_pct"], 100 * (1 - 84 / 86))
    assert published_for("sockmap", 100) is None
    zc4k = published_for("zerocopy", 4096)
    assert zc4k is not None and "cpu_pct" not in zc4k  # the paper gives no 4 KB figure
