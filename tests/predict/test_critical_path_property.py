"""The numba critical-path kernel agrees with the plain reference on random graphs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshtax.model.ecg import BatchBuilder
from meshtax.model.sidecar import SidecarConfig
from meshtax.predict.critical_path import propagate, structure
from tests.predict.reference_cp import graph_latency

# small integer times make ties, zero durations, back-to-back (sequential) and overlapping
# (parallel) siblings common
times = st.integers(0, 6).map(float)


@st.composite
def graphs(draw: st.DrawFn) -> list[tuple[int, float, float, float]]:
    n = draw(st.integers(1, 9))
    rows = []
    for i in range(n):
        parent = draw(st.integers(-1, i - 1))  # -1 more than once: multiple roots
        rows.append(
            (
                parent,
                draw(times),
                draw(st.sampled_from([0.0, 0.0, 1.0, 2.0, 3.0, 5.0])),
                draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])),
            )
        )
    return rows


@settings(max_examples=250, deadline=None)
@given(st.lists(graphs(), min_size=1, max_size=4))
def test_kernel_matches_reference(gs: list[list[tuple[int, float, float, float]]]) -> None:
    b = BatchBuilder()
    svc = b.service("s", SidecarConfig())
    extra: list[float] = []
    for k, g in enumerate(gs):
        b.add_graph(f"g{k}", [(p, svc, svc, 100.0, 100.0, 1.0, s, d) for p, s, d, _ in g])
        extra.extend(e for *_, e in g)
    batch = b.build()
    prop = propagate(structure(batch), np.array(extra))
    for k, g in enumerate(gs):
        base, new = graph_latency(
            [p for p, *_ in g], [s for _, s, _, _ in g], [d for _, _, d, _ in g], [e for *_, e in g]
        )
        assert prop.base_us[k] == base
        assert abs(prop.new_us[k] - new) <= 1e-9 * max(1.0, new)
        # some call is on the critical path of every non-empty graph
        assert prop.critical[batch.graph_ptr[k] : batch.graph_ptr[k + 1]].any()


def test_reference_sequential_and_parallel() -> None:
    # two sequential children (0-2, 2-4) under a 0-5 root: overhead adds up; parallel: max
    assert graph_latency([-1, 0, 0], [0, 0, 2], [5, 2, 2], [0, 1, 1]) == (5.0, 7.0)
    assert graph_latency([-1, 0, 0], [0, 0, 0], [5, 2, 2], [0, 1, 1]) == (5.0, 6.0)
