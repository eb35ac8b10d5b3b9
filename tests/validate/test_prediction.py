"""meshtax.validate.prediction: OTLP traces → ECG → prediction, with exact per-crossing costs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.components import TLS, Component, Kind
from meshtax.model.sidecar import Architecture, Mode, SidecarConfig
from meshtax.validate.prediction import one_hop, predict_traces
from tests.helpers import flat, profile

OTHER = Component(Kind.OTHER)
# per crossing: http 10 µs / 20 CPU-µs, tcp 5 µs / 8 CPU-µs, plus 0.01 µs per byte of latency in http
PROFILE = profile(
    {Mode.HTTP: {OTHER: flat(10.0, 20.0, slope_lat=0.01)}, Mode.TCP: {OTHER: flat(5.0, 8.0)}}
)


def _attrs(**kv: int | str) -> list[dict[str, Any]]:
    return [
        {
            "key": k.replace("_", "."),
            "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v},
        }
        for k, v in kv.items()
    ]


def _span(
    tid: str,
    sid: str,
    parent: str,
    name: str,
    kind: int,
    start_us: int,
    dur_us: int,
    **attrs: int | str,
) -> dict[str, Any]:
    t0 = 1_700_000_000_000_000
    return {
        "traceId": tid,
        "spanId": sid,
        "parentSpanId": parent,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str((t0 + start_us) * 1000),
        "endTimeUnixNano": str((t0 + start_us + dur_us) * 1000),
        "attributes": _attrs(**attrs),
    }


def _trace_file(tmp: Path, base_us: list[int]) -> Path:
    """One graph per entry: frontend (server span, ``base`` µs) calls db once (100 µs)."""
    fe: list[dict[str, Any]] = []
    db: list[dict[str, Any]] = []
    for i, base in enumerate(base_us):
        tid = f"{i + 1:032x}"
        fe.append(
            _span(
                tid,
                f"{i:04x}000000000001",
                "",
                "GET /q",
                2,
                0,
                base,
                http_request_body_size=0,
                http_response_body_size=1000,
            )
        )
        fe.append(
            _span(
                tid,
                f"{i:04x}000000000002",
                f"{i:04x}000000000001",
                "POST /get",
                3,
                100,
                100,
                http_request_body_size=100,
                http_response_body_size=300,
                peer_service="db",
            )
        )
        db.append(
            _span(
                tid,
                f"{i:04x}000000000003",
                f"{i:04x}000000000002",
                "POST /get",
                2,
                110,
                80,
                http_request_body_size=100,
                http_response_body_size=300,
            )
        )
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attrs(service_name=name)},
                "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}],
            }
            for name, spans in (("frontend", fe), ("db", db))
        ]
    }
    path = tmp / "t.json"
    path.write_text(json.dumps(doc))
    return path


def test_predict_traces_exact(tmp_path: Path) -> None:
    path = _trace_file(tmp_path, [1000, 1200, 1400])
    sidecars = {"frontend": SidecarConfig(Mode.HTTP), "db": SidecarConfig(Mode.TCP)}
    p = predict_traces(path, PROFILE, sidecars, rate=200.0)
    assert p.graphs == 3
    # entry hop: frontend inbound, request 0 B and response 1000 B: 10 + (10 + 10) = 30 µs;
    # frontend → db: frontend outbound (http) 2×10 + 0.01×400 = 24, db inbound (tcp) 2×5 = 10
    assert p.mean_us == pytest.approx(64.0)
    assert p.p50_us == pytest.approx(64.0) and p.p90_us == pytest.approx(64.0)
    assert p.base_p50_us == pytest.approx(1200.0)
    # CPU per request: entry 2×20, db hop 2×20 + 2×8
    assert p.cpu_us_per_request == pytest.approx(96.0)
    assert p.by_component_cpu_us == {"other": pytest.approx(96.0)}


def test_predict_traces_rate_does_not_change_per_request_cpu(tmp_path: Path) -> None:
    path = _trace_file(tmp_path, [1000])
    sidecars = {"frontend": SidecarConfig(Mode.HTTP), "db": SidecarConfig(Mode.HTTP)}
    a = predict_traces(path, PROFILE, sidecars, rate=50.0)
    b = predict_traces(path, PROFILE, sidecars, rate=5000.0)
    assert a.cpu_us_per_request == pytest.approx(b.cpu_us_per_request) == pytest.approx(40 + 80)
    with pytest.raises(ValueError):
        predict_traces(path, PROFILE, sidecars, rate=0.0)


def test_one_hop() -> None:
    p = one_hop(PROFILE, SidecarConfig(Mode.HTTP), 1000, rate=100.0)
    assert p.mean_us == pytest.approx(2 * (10 + 0.01 * 1000))
    assert p.cpu_us_per_request == pytest.approx(40.0)


# measured in the role: a node proxy 3 µs / 4 CPU-µs per crossing, +2 / +1 across nodes
NODE = profile({Mode.TCP: {OTHER: flat(3.0, 4.0), TLS: flat(2.0, 1.0)}}, name="node")


@pytest.mark.parametrize(
    ("nodes", "mean", "cpu"),
    [
        # one node: the entry hop crosses frontend's node proxy (2 × 3), the call to db the
        # same node proxy once (2 × 3)
        ({"frontend": "n0", "db": "n0"}, 12.0, 16.0),
        # two nodes: the call crosses both node proxies, each with the inter-node part
        ({"frontend": "n0", "db": "n1"}, 6.0 + 2 * 2 * 5.0, 8.0 + 2 * 2 * 5.0),
    ],
)
def test_predict_traces_in_an_architecture(
    tmp_path: Path, nodes: dict[str, str], mean: float, cpu: float
) -> None:
    path = _trace_file(tmp_path, [1000, 1200, 1400])
    sidecars = {"frontend": SidecarConfig(Mode.HTTP), "db": SidecarConfig(Mode.TCP)}
    p = predict_traces(
        path,
        PROFILE,
        sidecars,
        rate=200.0,
        architecture=Architecture.NODE_L4,
        nodes=nodes,
        roles={Architecture.NODE_L4: NODE},
    )
    assert p.mean_us == pytest.approx(mean)
    assert p.cpu_us_per_request == pytest.approx(cpu)
