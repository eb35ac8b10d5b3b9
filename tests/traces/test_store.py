"""Parquet store: round trip, partitions, incomplete stores refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshtax.model.ecg import BatchBuilder, EcgBatch
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.traces.store import StoreError, concat_batches, open_store, write_store


def _batch() -> EcgBatch:
    b = BatchBuilder()
    a = b.service("a", SidecarConfig(Mode.HTTP))
    c = b.service("c", SidecarConfig(Mode.GRPC, ("lua",)))
    for k in range(5):
        b.add_graph(
            f"g{k}",
            [(-1, -1, a, 1.0, 2.0, 3.0, 0.0, 10.0 + k), (0, a, c, 4.0, 5.0, 6.0, 1.0, 2.0)][
                : 1 + k % 2
            ],
        )
    return b.build()


def test_round_trip_in_partitions(tmp_path: Path) -> None:
    batch = _batch()
    st = write_store([batch], tmp_path / "s", partition_graphs=2, report={"x": 1})
    assert len(st.partitions) == 3 and st.n_graphs == 5 and st.report == {"x": 1}
    again = concat_batches(list(open_store(tmp_path / "s")))
    for f in (
        "graph_ptr",
        "parent",
        "caller",
        "callee",
        "caller_spec",
        "callee_spec",
        "request_bytes",
        "response_bytes",
        "rate",
        "start_us",
        "duration_us",
    ):
        assert np.array_equal(getattr(again, f), getattr(batch, f)), f
    assert (
        again.graph_names == batch.graph_names
        and again.services == batch.services
        and again.specs == batch.specs
    )


def test_refuses_incomplete_and_existing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no manifest.json"):
        open_store(tmp_path)
    write_store([_batch()], tmp_path / "s")
    with pytest.raises(StoreError, match="already holds"):
        write_store([_batch()], tmp_path / "s")
    write_store([_batch()], tmp_path / "s", overwrite=True)
