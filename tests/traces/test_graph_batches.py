"""``iter_graph_batches``: the graphs of ``load_traces`` in several batches, rates included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshtax.traces import (
    ImportReport,
    SpanOptions,
    TraceFormatError,
    iter_graph_batches,
    load_traces,
)
from tests.app.test_predict_stream import _jaeger


@pytest.mark.parametrize("rate", [7.0, None])
def test_batches_hold_the_graphs_of_one_load(tmp_path: Path, rate: float | None) -> None:
    f = _jaeger(tmp_path / "t.json", 150)
    opts = SpanOptions(rate=rate, batch_spans=300)
    rep = ImportReport(str(f), "jaeger")
    batches = list(iter_graph_batches(str(f), "jaeger", opts, rep))
    whole = load_traces(str(f), "jaeger", opts)
    assert len(batches) > 2
    assert sum((b.graph_names for b in batches), ()) == whole.batch.graph_names
    assert rep.to_dict() == whole.report.to_dict()
    rates = np.concatenate([b.rate for b in batches])
    assert np.array_equal(rates, whole.batch.rate) and np.isfinite(rates).all()
    for b in batches:  # each batch's services and their nodes, as in the one load
        names = {s: whole.batch.services.index(s) for s in b.services}
        assert b.service_node is not None and whole.batch.service_node is not None
        for k, s in enumerate(b.services):
            assert (b.service_node[k] >= 0) == (whole.batch.service_node[names[s]] >= 0)


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="expected one of"):
        next(iter_graph_batches(str(tmp_path), "csv", SpanOptions(), ImportReport("", "csv")))
