"""What a topology's tail run records beside its latencies: each service apart, and each
sidecar's connections and requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshtax.validate.tail_record import connection_counters, keep_counters, service_groups


def test_each_services_app_and_sidecar_are_kept_apart() -> None:
    got = service_groups({"frontend": [10, 11, 12], "ratings": [20, 21]}, {11, 21})
    assert got == {
        "app:frontend": [10, 12],
        "sidecar:frontend": [11],
        "app:ratings": [20],
        "sidecar:ratings": [21],
    }
    assert service_groups({"x": [1]}, set()) == {"app:x": [1], "sidecar:x": []}


STATS = {
    "http.inbound.downstream_cx_total": 32,
    "http.inbound.downstream_rq_total": 1000,
    "http.outbound.downstream_cx_total": 3,
    "http.outbound.downstream_rq_total": 1000,
    "http.admin.downstream_cx_total": 7,
    "http.admin.downstream_rq_total": 9,
    "listener.0.0.0.0_15006.downstream_cx_total": 35,
    "cluster.inbound_app.upstream_cx_total": 4,
    "cluster.inbound_app.upstream_rq_total": 1000,
    "cluster.outbound_x.upstream_cx_total": 2,
    "cluster.outbound_x.upstream_rq_total": 1000,
    "cluster.outbound_x.upstream_cx_active": 2,
}


def test_connection_counters_sum_managers_and_clusters_not_admin_or_listeners() -> None:
    assert connection_counters(STATS) == {
        "downstream_cx_total": 35,
        "downstream_rq_total": 2000,
        "upstream_cx_total": 6,
        "upstream_rq_total": 2000,
    }
    assert connection_counters({}) == dict.fromkeys(
        ("downstream_cx_total", "downstream_rq_total", "upstream_cx_total", "upstream_rq_total"), 0
    )


class _Envoy:
    def __init__(self, stats: dict[str, int] | None) -> None:
        self._stats = stats

    def stats(self) -> dict[str, int]:
        if self._stats is None:
            raise RuntimeError("admin did not answer")
        return self._stats


def test_keep_counters_records_every_sidecar_and_an_error_instead_of_failing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mesh" / "envoy-counters.json"
    envoys: Any = {"frontend": _Envoy(STATS), "ratings": _Envoy(None)}
    keep_counters(envoys, path)
    got = json.loads(path.read_text())
    assert got["frontend"]["upstream_cx_total"] == 6
    assert got["ratings"] == {"error": "RuntimeError: admin did not answer"}
