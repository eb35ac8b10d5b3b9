"""Shared CPUs: every message is priced at the one-hop rate that loads the CPU alike."""

from __future__ import annotations

import numpy as np
import pytest

from meshtax.model.components import OTHER
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import to_batch
from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.predict.shared_cpu import shared_cpu_rates
from tests.helpers import EXTERNAL, ecg, inv, profile

HTTP = SidecarConfig(Mode.HTTP)


def test_shared_cpus_price_messages_at_the_rate_that_loads_the_cpu_alike() -> None:
    # OTHER CPU: 2 CPU-µs at 1000/s, +3 per e-fold below, profiled from 10/s; no latency-path effect
    rated = ComponentModel(
        CostModel(0.1), CostModel(2.0, rate_coef=3.0, rate_lo=10.0, rate_hi=1000.0)
    )
    prof = profile({Mode.HTTP: {OTHER: rated}})
    calls = [
        inv("r", EXTERNAL, "A", 0, 100, rate=100),
        inv("b", "A", "B", 10, 30, "r", rate=100),
        inv("c", "A", "C", 50, 30, "r", rate=100),
    ]
    b = to_batch([ecg({"A": HTTP, "B": HTTP, "C": HTTP}, calls)])
    # 10 crossings per request at 100/s = 1000 crossings/s on one CPU: a one-hop at 500/s loads it alike
    assert shared_cpu_rates(b, 1).tolist() == [500.0] * 3
    assert shared_cpu_rates(b, 2).tolist() == [250.0] * 3
    per_crossing = 2.0 + 3.0 * np.log(1000 / 500)
    one = predict_batch(b, single_profile(prof), pod_cpus=1)
    assert one.cpu_vcpu[0] == pytest.approx(10 * per_crossing * 100 * 1e-6)
    # on CPUs of their own, every sidecar is priced at its own rate (100/s)
    own = predict_batch(b, single_profile(prof))
    assert own.cpu_vcpu[0] == pytest.approx(10 * (2.0 + 3.0 * np.log(10)) * 100 * 1e-6)


def test_a_graph_without_sidecars_keeps_its_rates_and_pod_cpus_is_checked() -> None:
    calls = [inv("r", EXTERNAL, "A", 0, 100, rate=100), inv("b", "A", "B", 10, 30, "r", rate=50)]
    b = to_batch([ecg({"A": NO_SIDECAR, "B": NO_SIDECAR}, calls)])
    assert shared_cpu_rates(b, 1).tolist() == [100.0, 50.0]
    with pytest.raises(ValueError, match="pod_cpus"):
        shared_cpu_rates(b, 0)
