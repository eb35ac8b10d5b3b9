"""Synthetic generator: reproducible, read back by the readers, calibrated to published statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshtax.model.ecg import EcgBatch
from meshtax.traces.api import load_traces
from meshtax.traces.synth import generate


def _depth_per_graph(b) -> np.ndarray:  # type: ignore[no-untyped-def]
    d = np.zeros(b.n_invocations, dtype=np.int64)
    for i in range(b.n_invocations):  # parents precede children
        d[i] = 1 if b.parent[i] < 0 else d[b.parent[i]] + 1
    out = np.zeros(b.n_graphs, dtype=np.int64)
    np.maximum.at(out, b.graph_of(), d)
    return out


@pytest.fixture(scope="module")
def v2021(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    p = tmp_path_factory.mktemp("gen") / "g.csv.gz"
    s = generate(4000, 11, "alibaba-v2021", p)
    return s, load_traces(p)


def test_reproducible(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    generate(300, 5, "alibaba-v2022", a)
    generate(300, 5, "alibaba-v2022", b)
    generate(300, 6, "alibaba-v2022", c)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_read_back_whole(v2021) -> None:  # type: ignore[no-untyped-def]
    s, r = v2021
    assert r.report.graphs_kept == s.graphs == 4000 and r.report.graphs_dropped == 0
    assert r.batch.n_invocations == s.calls
    assert r.report.rows_merged > 0  # rpc/http calls logged twice


def test_calibration(v2021) -> None:  # type: ignore[no-untyped-def]
    _, r = v2021
    b = r.batch
    depth = _depth_per_graph(b)
    assert abs(depth.mean() - 4.27) < 0.35
    assert abs(depth.std() - 3.25) < 0.35
    assert (depth > 10).mean() > 0.04
    svc = np.array(
        [
            len(set(b.callee[lo:hi].tolist()) | (set(b.caller[lo:hi].tolist()) - {-1}))
            for lo, hi in zip(b.graph_ptr[:-1], b.graph_ptr[1:])
        ]
    )
    assert (svc > 40).mean() > 0.10
    kids = np.bincount(b.parent[b.parent >= 0], minlength=b.n_invocations)
    f = kids[kids > 0]
    assert 3.6 < f.mean() < 4.6 and np.bincount(f).argmax() == 3 and 0.07 < (f > 10).mean() < 0.14
    # rpc and memcached dominate the call types
    text = load_types(b)
    assert text["rpc"] + text["mc"] > 0.6


def load_types(b: EcgBatch) -> dict[str, float]:
    names = [b.services[i] for i in b.callee]
    mc = sum(n.startswith("MC_") for n in names) / len(names)
    db = sum(n.startswith("DB_") for n in names) / len(names)
    mq = sum(n.startswith("MQ_") for n in names) / len(names)
    return {"mc": mc, "db": db, "mq": mq, "rpc": 1 - mc - db - mq}


def test_v2022_and_broken_graphs(tmp_path: Path) -> None:
    p = tmp_path / "g.csv"
    s = generate(1000, 3, "alibaba-v2022", p, broken_fraction=0.3)
    assert 200 < s.broken_graphs < 400
    r = load_traces(p)
    assert r.report.graphs_kept == 1000
    assert (
        r.report.notes["parent rpcid missing: attached to nearest logged ancestor"]
        >= s.broken_graphs
    )
    assert r.report.rows_merged > 0


def test_zero_graphs(tmp_path: Path) -> None:
    p = tmp_path / "z.csv"
    generate(0, 1, "alibaba-v2021", p)
    assert load_traces(p).batch.n_graphs == 0
