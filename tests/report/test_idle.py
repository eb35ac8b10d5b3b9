"""The idle sidecars' CPU in a prediction document: per graph and per service, and on shared
CPUs in the latency each service puts on the path."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshtax.model.components import OTHER
from meshtax.model.ecg import to_batch
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.report.result import prediction_document
from tests.helpers import EXTERNAL, ecg, flat, inv, profile

HTTP = SidecarConfig(Mode.HTTP)


@pytest.mark.parametrize("pod_cpus", [None, 1])
def test_by_service_counts_each_idle_sidecar_once(pod_cpus: int | None) -> None:
    p = profile({Mode.HTTP: {OTHER: flat(5, 2)}})
    p = replace(p, modes={Mode.HTTP: replace(p.modes[Mode.HTTP], idle_cpu_us_per_s=2000.0)})
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [
            inv("r", EXTERNAL, "A", 0, 100, rate=50),
            inv("b", "A", "B", 10, 20, "r", rate=50),
            inv("b2", "A", "B", 40, 20, "r", rate=50),
        ],
    )
    b = to_batch([g])
    bp = predict_batch(b, single_profile(p), pod_cpus=pod_cpus)
    doc = prediction_document(b, bp, p, host=None, options={})
    (graph,) = doc["graphs"]
    svc = {s["service"]: s for s in graph["by_service"]}
    # message CPU: A 2 + 2 + 2 crossings, B 2 + 2, × 2 CPU-µs × 50/s; idle 0.002 each
    assert svc["A"]["cpu_vcpu"] == pytest.approx(6 * 2 * 50e-6 + 0.002)
    assert svc["B"]["cpu_vcpu"] == pytest.approx(4 * 2 * 50e-6 + 0.002)
    assert sum(s["cpu_vcpu"] for s in svc.values()) == pytest.approx(graph["cpu_vcpu"]["value"])
    on_path = sum(s["latency_on_path_us"] for s in svc.values())
    if pod_cpus is None:  # the critical path: 2 + 4 + 4 crossings of 5 µs, no idle
        assert graph["latency_overhead_us"]["value"] == pytest.approx(50.0) == on_path
    else:  # one CPU: 20 CPU-µs of messages + 2 × 40 µs of idle share per request
        assert graph["latency_overhead_us"]["value"] == pytest.approx(100.0) == on_path
