"""When a window counts as disturbed."""

from __future__ import annotations

import pytest

from meshtax.testbed.interference import Interference, Thresholds


def test_self_contention_is_recorded_not_refused_others_and_steal_are() -> None:
    # a closed-loop window on a quiet machine: sidecar and app wait for each other, no one else
    quiet = Interference(0.5, others=0.0, steal=0.0, wait=0.71)
    assert not quiet.contaminated(Thresholds())
    assert quiet.excess(Thresholds()) == 0.0
    assert quiet.contaminated(Thresholds(wait=0.2))  # the old default refused it
    assert Interference(0.5, others=0.3, steal=0.0, wait=0.0).excess(Thresholds()) == pytest.approx(
        3.0
    )
    assert Interference(0.5, others=0.0, steal=0.06, wait=0.0).contaminated(Thresholds())
    assert Thresholds().to_dict() == {"others": 0.1, "steal": 0.05, "wait": None}
