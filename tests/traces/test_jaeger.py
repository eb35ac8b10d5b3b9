"""The columnar Jaeger reader gives what a span-by-span reading of the same traces gives: each
span's kind, sizes (attributes, else message events), peer, protocol and parent read one at
a time by the shared attribute rules (``decode._Attrs``), paired by the row path; and the
services in the order a span-by-span reader meets them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from meshtax.traces import decode, jaeger
from meshtax.traces.api import load_traces
from meshtax.traces.report import ImportReport
from meshtax.traces.spans import SpanOptions, k8s_name, pair_rows, to_ecgs

KEYS = [
    "http.request.body.size",
    "http.request_content_length",
    "rpc.request.size",
    "rpc.message.uncompressed_size",
    "http.response.body.size",
    "rpc.response.size",
    "peer.service",
    "server.address",
    "net.peer.name",
    "db.system",
    "rpc.system",
    "http.url",
    "component",
]
SERVICES = ["front", "Auth.ns", "cart_x", "db", "", "redis"]
KINDS = ["server", "client", "internal", "producer", "consumer", "SERVER", "span_kind_client", None]


def _value(rng: random.Random) -> Any:
    return rng.choice(
        [
            rng.randint(-5, 5000),
            str(rng.randint(0, 300)),
            "abc",
            "  ",
            True,
            None,
            1.5,
            10**18 - 1,
            10**18,
            2**63 + 5,
            "grpc",
            "GRPC",
            rng.choice(SERVICES),
        ]
    )


def _trace(rng: random.Random, t: int) -> dict[str, Any]:
    """A trace object with what the reader must get right: duplicate span ids, missing and
    non-CHILD_OF references, inline processes, several candidates for one slot, odd values,
    message events in logs."""
    ids = [f"{rng.getrandbits(16):04x}" for _ in range(rng.randint(1, 12))]
    if rng.random() < 0.1:
        ids[-1] = ids[0]
    procs = {
        f"p{p}": {
            "serviceName": rng.choice(SERVICES),
            "tags": [{"key": rng.choice(["k8s.node.name", "host.name", "ip"]), "value": f"n{p}"}],
        }
        for p in range(rng.randint(0, 4))
    }
    spans = []
    for i, sid in enumerate(ids):
        refs = []
        if i and rng.random() < 0.9:
            parent = rng.choice([*ids[:i], "gone"])
            refs.append(
                {"refType": rng.choice(["CHILD_OF"] * 8 + ["FOLLOWS_FROM", "X"]), "spanID": parent}
            )
            if rng.random() < 0.1:
                refs.insert(0, {"refType": "X", "spanID": ids[0]})
        tags = [{"key": "span.kind", "value": rng.choice(KINDS)}] if rng.random() < 0.95 else []
        tags += [{"key": rng.choice(KEYS), "value": _value(rng)} for _ in range(rng.randint(0, 5))]
        if rng.random() < 0.1:
            tags.append({"key": "span.kind", "value": rng.choice(KINDS)})
        logs = [
            {
                "fields": [
                    {"key": "message.type", "value": rng.choice(["SENT", "RECEIVED", "x"])},
                    {"key": "message.uncompressed_size", "value": rng.choice([10, 20, "30", -1])},
                ]
            }
            for _ in range(rng.randint(1, 3) if rng.random() < 0.15 else 0)
        ]
        span = {
            "spanID": sid,
            "references": refs,
            "startTime": 1_700_000_000_000_000 + rng.randint(0, 2000),
            "duration": rng.randint(0, 2000),
            "tags": tags,
            "logs": logs,
        }
        if procs and rng.random() < 0.9:
            span["processID"] = rng.choice([*procs, "nope"])
        else:
            span["process"] = {"serviceName": rng.choice(SERVICES), "tags": []}
        spans.append(span)
    return {"traceID": f"t{t:04d}", "spans": spans, "processes": procs}


def _kind(tags: list[dict[str, Any]]) -> int:
    kind = None
    for g in tags:
        if g["key"] == "span.kind":
            kind = g["value"]
    return decode.INTERNAL if kind is None else decode._kind_code(str(kind), "test")


def _rows(traces: list[dict[str, Any]]) -> tuple[list[decode.Row], list[str]]:
    """Span rows read one span at a time, and the service names in the order met."""
    rows: list[decode.Row] = []
    met: dict[str, None] = {}
    for t in traces:
        procs = {k: p["serviceName"] for k, p in t["processes"].items()}
        met.update(dict.fromkeys(procs.values()))
        for s in t["spans"]:
            a = decode._Attrs()
            for g in s["tags"]:
                a.add(g["key"], g["value"])
            kind = _kind(s["tags"])
            for log in s["logs"]:
                a.event(((f["key"], f["value"]) for f in log["fields"]), kind)
            req, resp = a.sizes()
            ok = [
                r["spanID"] for r in s["references"] if r["refType"] in ("CHILD_OF", "FOLLOWS_FROM")
            ]
            service = (
                s["process"]["serviceName"] if "process" in s else procs.get(s["processID"], "")
            )
            if "process" in s:
                met[service] = None
            if a.peer:
                met[a.peer] = None
            start = s["startTime"] * 1000
            rows.append(
                (t["traceID"], s["spanID"], ok[0] if ok else "", service, kind, start,
                 s["duration"] * 1000, req, resp, a.peer, a.proto)
            )  # fmt: skip
    return rows, list(met)


@pytest.mark.parametrize("seed", range(12))
def test_columns_agree_with_a_span_by_span_reading(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jaeger, "CHUNK_SPANS", [7, 50, 10**6][seed % 3])  # chunks of traces
    rng = random.Random(seed)
    traces = [_trace(rng, t) for t in range(40)]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"data": traces}))
    opts = SpanOptions(rate=5.0)
    got = load_traces(f, "jaeger", opts)
    rows, met = _rows(traces)
    rep = ImportReport(str(f), "jaeger")
    want = pair_rows(rows, rep, opts)
    assert [repr(e) for e in got.ecgs] == [repr(e) for e in to_ecgs(want, opts)]
    assert got.report.to_dict() == rep.to_dict()
    # services: every name met, in the order met (a peer can come before a service)
    assert got.batch.services == tuple(dict.fromkeys(k8s_name(n) for n in met if n))


def test_a_peer_met_before_its_service_keeps_its_place(tmp_path: Path) -> None:
    def trace(t: str, service: str, peer: str) -> dict[str, Any]:
        tags = [{"key": "span.kind", "value": "client"}, {"key": "peer.service", "value": peer}]
        span = {"spanID": "1", "startTime": 1, "duration": 5, "processID": "p", "tags": tags}
        return {"traceID": t, "spans": [span], "processes": {"p": {"serviceName": service}}}

    f = tmp_path / "t.json"
    f.write_text(json.dumps({"data": [trace("a", "web", "zeta"), trace("b", "alpha", "x")]}))
    r = load_traces(f, "jaeger", SpanOptions(rate=1.0))
    # a reader of one span at a time meets zeta (trace a's peer) before alpha (trace b's
    # service); the columns read peers after every trace of the task, and put them back
    assert r.batch.services == ("web", "zeta", "alpha", "x")
