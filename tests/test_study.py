"""The large-scale study: agrees with predict_batch, skips unpriceable configurations,
writes CDFs and what-if data, and gives identical results on a Dask LocalCluster."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from meshtax.model.components import IPC, OTHER, PARSING, filter_component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import ModeProfile, Platform, Profile, Provenance
from meshtax.model.sidecar import Mode
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.store.reference import reference_profile
from meshtax.study import (
    PAPER_FILTERS,
    StudyConfig,
    StudyError,
    paper_configs,
    retarget,
    run_study,
)
from meshtax.traces.alibaba import AlibabaOptions
from meshtax.traces.api import ingest
from meshtax.traces.store import Store, concat_batches
from meshtax.traces.synth import generate


def _profile(scale: float = 1.0, name: str = "test") -> Profile:
    def cm(lat: float, cpu: float) -> ComponentModel:
        # CPU with a rate term, so the study's (size, rate) evaluation is compared too
        rated = CostModel(
            cpu * scale, 0.002 * scale, rate_coef=0.5 * scale, rate_lo=10.0, rate_hi=50_000.0
        )
        return ComponentModel(CostModel(lat * scale, 0.01 * scale), rated)

    modes = []
    for mode, parse in ((Mode.TCP, 0.0), (Mode.HTTP, 20.0), (Mode.GRPC, 30.0)):
        comps = {IPC: cm(5.0, 4.0), OTHER: cm(10.0, 8.0), PARSING: cm(parse, parse)}
        if mode is not Mode.TCP:
            comps.update(
                {filter_component(f): cm(3.0 + i, 2.0 + i) for i, f in enumerate(PAPER_FILTERS)}
            )
        modes.append(ModeProfile(mode, comps))
    return Profile(
        name,
        Platform("cpu", 2, "6.18"),
        Provenance("derived", "test", "2026-11-22"),
        {m.mode: m for m in modes},
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    d = tmp_path_factory.mktemp("study")
    generate(1500, 2, "alibaba-v2022", d / "g.csv", broken_fraction=0.1)
    st, _ = ingest(
        d / "g.csv",
        d / "store",
        options=AlibabaOptions(partition_graphs=400, unmeshed_types=frozenset({"mq"})),
        progress=False,
    )
    assert len(st.partitions) == 4
    return st


def _table(out: Path):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return pa.concat_tables([pq.read_table(p) for p in sorted((out / "graphs").glob("*.parquet"))])


def test_study_matches_predict_batch(store: Store, tmp_path: Path) -> None:
    prof = _profile()
    s = run_study(store, None, prof, tmp_path, progress=False)
    assert s.configs == tuple(c.name for c in paper_configs()) and not s.skipped
    assert s.graphs == 1500
    t = _table(tmp_path)
    batch = concat_batches(list(store))
    assert t.column("graph").to_pylist() == list(batch.graph_names)
    for cfg in paper_configs():
        pred = predict_batch(retarget(batch, cfg.sidecar), single_profile(prof))
        np.testing.assert_allclose(
            t.column(f"{cfg.name}.latency_overhead_us").to_numpy(),
            pred.latency_overhead_us,
            rtol=1e-9,
            atol=1e-9,
        )
        np.testing.assert_allclose(
            t.column(f"{cfg.name}.cpu_vcpu").to_numpy(), pred.cpu_vcpu, rtol=1e-9, atol=1e-12
        )
    # filters cost more than none; gRPC more than TCP on every graph
    assert np.all(
        t.column("http+5filters.cpu_vcpu").to_numpy() > t.column("http.cpu_vcpu").to_numpy()
    )
    assert np.all(
        t.column("grpc.latency_overhead_us").to_numpy()
        >= t.column("tcp.latency_overhead_us").to_numpy()
    )
    cdf = (tmp_path / "cdf.csv").read_text().splitlines()
    assert cdf[0] == "config,metric,quantile,value" and len(cdf) == 1 + 5 * 3 * 1001
    # the summary says how far to trust the profile it priced with
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["profile_quality"] == prof.quality()
    assert written["profile_quality"]["status"] == "unchecked"  # no closure recorded


def test_reference_profile_skips_filter_configs(store: Store, tmp_path: Path) -> None:
    # Table 3 measured the five filters in HTTP mode only
    s = run_study(store, None, reference_profile(), tmp_path, progress=False)
    assert s.configs == ("tcp", "http", "grpc", "http+5filters")
    assert set(s.skipped) == {"grpc+5filters"} and "filter" in s.skipped["grpc+5filters"]
    with pytest.raises(StudyError, match="no configuration"):
        run_study(
            store,
            [c for c in paper_configs() if c.name == "grpc+5filters"],
            reference_profile(),
            tmp_path,
            progress=False,
        )


def test_whatif_speedup(store: Store, tmp_path: Path) -> None:
    s = run_study(
        store,
        [StudyConfig("http", paper_configs()[1].sidecar)],
        _profile(),
        tmp_path,
        speedup_profile=lambda p: _profile(0.5, "half"),
        progress=False,
    )
    w = s.whatif["http"]
    assert w["cpu_vcpu.reduction_pct_p50"] == pytest.approx(50.0)
    # latency is convex in the overheads (slack absorbs a fixed amount): halving them at least halves it
    assert (
        0 < w["latency_overhead_us.after_mean"] <= 0.5 * w["latency_overhead_us.before_mean"] + 1e-9
    )
    assert (tmp_path / "whatif.csv").exists()


def test_dask_local_cluster_identical(store: Store, tmp_path: Path) -> None:
    from dask.distributed import LocalCluster

    prof = _profile()
    run_study(store, None, prof, tmp_path / "local", progress=False)
    with LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        s = run_study(
            store,
            None,
            prof,
            tmp_path / "dask",
            engine="dask",
            scheduler=cluster.scheduler_address,
            progress=False,
        )
    assert s.engine == "dask"
    assert _table(tmp_path / "local").equals(_table(tmp_path / "dask"))
    assert (tmp_path / "local" / "cdf.csv").read_text() == (
        tmp_path / "dask" / "cdf.csv"
    ).read_text()


def test_partition_prices_new_connections_and_protocols_like_predict_batch() -> None:
    from dataclasses import replace

    from meshtax.model.components import TLS
    from meshtax.model.ecg import to_batch
    from meshtax.model.sidecar import SidecarConfig
    from meshtax.study import predict_partition
    from tests.helpers import EXTERNAL, ecg, inv

    base = _profile()
    tcp = replace(
        base.modes[Mode.TCP],
        tls_handshake=ComponentModel(CostModel(90.0), CostModel(30.0)),
        components={
            **base.modes[Mode.TCP].components,
            TLS: ComponentModel(CostModel(1.0), CostModel(0.5)),
        },
        carried={
            "grpc": ModeProfile(Mode.TCP, {OTHER: ComponentModel(CostModel(20.0), CostModel(15.0))})
        },
    )
    prof = replace(base, modes={**base.modes, Mode.TCP: tcp})
    side = SidecarConfig(Mode.TCP, mtls=True)
    calls = [
        inv("r", EXTERNAL, "A", 0, 1000, rate=500),
        replace(inv("c", "A", "B", 10, 100, "r", rate=500), new_connections=0.3, protocol="grpc"),
    ]
    batch = to_batch([ecg({"A": side, "B": side}, calls)])
    cols = predict_partition(batch, [StudyConfig("t", side)], prof)
    pred = predict_batch(retarget(batch, side), single_profile(prof))
    assert cols["t.latency_overhead_us"][0] == pytest.approx(pred.latency_overhead_us[0])
    assert cols["t.cpu_vcpu"][0] == pytest.approx(pred.cpu_vcpu[0])
    # the handshake and the carried gRPC model are in it: 2 sidecars × 0.3 × 90 µs of latency at least
    assert pred.latency_overhead_us[0] > 2 * 0.3 * 90
