"""ECG files: every malformed input gives a clear error naming the file, field and expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtax.model.ecg import EXTERNAL, ECGError
from meshtax.model.sidecar import Mode
from meshtax.traces.ecg_file import load_ecg_file

GOOD = """
name: t
rate: 50
defaults: {request_bytes: 200, sidecar: {mode: grpc}}
services:
  a: {}
  b: {sidecar: none}
  c: {sidecar: {mode: http, filters: [lua], mtls: true}, platform: reference}
invocations:
  - {id: r, callee: a, start_us: 0, duration_us: 100}
  - {id: x, parent: r, callee: b, start_us: 10, duration_us: 20}
  - {id: y, parent: r, callee: c, start_us: 40, duration_us: 20, rate: 7, response_bytes: 900}
"""


def write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_good_file_with_defaults(tmp_path: Path) -> None:
    (g,) = load_ecg_file(write(tmp_path, GOOD))
    r, x, y = g.invocations
    assert r.caller == EXTERNAL and x.caller == "a" and y.caller == "a"
    assert (r.request_bytes, r.response_bytes, r.rate) == (200, 100, 50)
    assert (y.rate, y.response_bytes) == (7, 900)
    assert g.services["a"].sidecar.mode is Mode.GRPC and not g.services["b"].sidecar.meshed
    assert (
        g.services["c"].sidecar.filters == ("lua",)
        and g.services["c"].sidecar.mtls
        and g.services["c"].platform == "reference"
    )


def test_json_and_multiple_graphs(tmp_path: Path) -> None:
    import json

    doc = {
        "name": "api",
        "services": {"a": {}},
        "graphs": [
            {"invocations": [{"callee": "a", "duration_us": 10}]},
            {"name": "slow", "invocations": [{"callee": "a", "duration_us": 20}]},
        ],
    }
    gs = load_ecg_file(write(tmp_path, json.dumps(doc), "g.json"))
    assert [g.name for g in gs] == ["api#0", "slow"]


BAD = [
    (
        "negative size",
        GOOD.replace("response_bytes: 900", "response_bytes: -5"),
        "invocations[2].response_bytes: -5; expected a number ≥ 0",
    ),
    (
        "unknown service",
        GOOD.replace("callee: b,", "callee: nope,"),
        "invocations[1] (id 'x').callee: unknown service 'nope'",
    ),
    (
        "unknown parent",
        GOOD.replace("parent: r, callee: b", "parent: q, callee: b"),
        "invocations[1] (id 'x').parent: unknown invocation id 'q'",
    ),
    (
        "ends after parent",
        GOOD.replace("start_us: 40, duration_us: 20", "start_us: 40, duration_us: 90"),
        "invocations[2] (id 'y').duration_us: ends at 130 µs, after its parent 'r' ends (100 µs)",
    ),
    ("starts before parent", GOOD.replace("start_us: 10,", "start_us: -10,"), "starts (0 µs)"),
    (
        "wrong type",
        GOOD.replace("rate: 50", "rate: fast"),
        "rate: 'fast' is text; expected a finite number",
    ),
    (
        "unknown field",
        GOOD.replace("rate: 50", "rate: 50\nspeed: 3"),
        "(top level): unknown field(s) 'speed'; expected defaults,",
    ),
    ("bad mode", GOOD.replace("mode: grpc", "mode: quic"), "defaults.sidecar"),
    (
        "missing callee",
        GOOD.replace("{id: r, callee: a,", "{id: r,"),
        "invocations[0]: missing 'callee'",
    ),
    ("duplicate id", GOOD.replace("{id: x,", "{id: r,"), "duplicate id"),
    ("yaml syntax", "services: [a\n", "YAML syntax error"),
    ("empty", "  \n", "the file is empty"),
    ("not a mapping", "- 1\n- 2\n", "expected a mapping"),
    ("no invocations", "services: {a: {}}\n", "expected exactly one of 'invocations' or 'graphs'"),
]


@pytest.mark.parametrize(("case", "text", "message"), BAD, ids=[b[0] for b in BAD])
def test_malformed_files_are_reported_clearly(
    tmp_path: Path, case: str, text: str, message: str
) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ECGError) as e:
        load_ecg_file(p)
    assert str(p) in str(e.value)
    assert message in str(e.value)


def test_cycle_is_reported(tmp_path: Path) -> None:
    text = """
services: {a: {}, b: {}}
invocations:
  - {id: r, callee: a, duration_us: 100}
  - {id: x, parent: y, caller: b, callee: a, start_us: 0, duration_us: 10}
  - {id: y, parent: x, caller: a, callee: b, start_us: 0, duration_us: 10}
"""
    with pytest.raises(ECGError, match=r"cycle through parent links: (x → y → x|y → x → y)"):
        load_ecg_file(write(tmp_path, text))


def test_all_problems_reported_together(tmp_path: Path) -> None:
    text = GOOD.replace("callee: b,", "callee: nope,").replace(
        "start_us: 40, duration_us: 20", "start_us: 40, duration_us: 90"
    )
    with pytest.raises(ECGError) as e:
        load_ecg_file(write(tmp_path, text))
    assert len(e.value.problems) == 2


def test_missing_file() -> None:
    with pytest.raises(ECGError, match="file not found"):
        load_ecg_file("/nonexistent/x.yaml")


def test_bundled_examples_load() -> None:
    from importlib import resources

    root = resources.files("meshtax").joinpath("data/examples")
    names = sorted(
        f.name for f in root.iterdir() if f.name.endswith(".yaml") and "speedup" not in f.name
    )
    assert len(names) == 7
    for n in names:
        with resources.as_file(root.joinpath(n)) as p:
            assert load_ecg_file(p)


def test_protocol_per_call_and_default(tmp_path: Path) -> None:
    p = tmp_path / "g.yaml"
    p.write_text(
        "defaults: {protocol: grpc}\nservices: {a: {sidecar: tcp}, b: {sidecar: tcp}}\n"
        "invocations:\n  - {id: r, callee: a, duration_us: 100}\n"
        "  - {id: c, parent: r, callee: b, protocol: http, duration_us: 10}\n"
    )
    (g,) = load_ecg_file(p)
    assert [i.protocol for i in g.invocations] == ["grpc", "http"]
    p.write_text(
        "services: {a: {sidecar: tcp}}\ninvocations:\n  - {id: r, callee: a, protocol: thrift}\n"
    )
    with pytest.raises(ECGError, match="protocol"):
        load_ecg_file(p)


def test_new_connections_share(tmp_path: Path) -> None:
    p = tmp_path / "g.yaml"
    p.write_text(
        "services: {a: {sidecar: http}}\ninvocations:\n  - {id: r, callee: a, new_connections: 0.5}\n"
    )
    (g,) = load_ecg_file(p)
    assert g.invocations[0].new_connections == 0.5
    p.write_text(
        "services: {a: {sidecar: http}}\ninvocations:\n  - {id: r, callee: a, new_connections: 2}\n"
    )
    with pytest.raises(ECGError, match="new_connections"):
        load_ecg_file(p)


def test_tls_version_of_a_sidecar(tmp_path: Path) -> None:
    p = tmp_path / "g.yaml"
    p.write_text(
        "defaults: {sidecar: {mode: http, mtls: true, tls_version: '1.2'}}\n"
        "services: {a: {}, b: {sidecar: {mtls: false}}, c: {sidecar: {tls_version: '1.3'}}}\n"
        "invocations:\n  - {id: r, callee: a}\n  - {id: x, parent: r, callee: b}\n  - {id: y, parent: r, callee: c}\n"
    )
    (g,) = load_ecg_file(p)
    s = {k: (v.sidecar.mtls, v.sidecar.tls_version) for k, v in g.services.items()}
    # switching mTLS off drops the default's version with it
    assert s == {"a": (True, "1.2"), "b": (False, None), "c": (True, "1.3")}
    p.write_text(
        "services: {a: {sidecar: {mode: tcp, tls_version: '1.3'}}, "
        "b: {sidecar: {mode: tcp, mtls: true, tls_version: '1.1'}}}\n"
        "invocations:\n  - {id: r, callee: a}\n"
    )
    with pytest.raises(ECGError) as e:
        load_ecg_file(p)
    assert "services.b.sidecar.tls_version: '1.1'; expected one of 1.2, 1.3" in str(e.value)
    p.write_text(
        "services: {a: {sidecar: {mode: tcp, tls_version: '1.3'}}}\ninvocations:\n  - {id: r, callee: a}\n"
    )
    with pytest.raises(
        ECGError, match=r"services.a.sidecar: tls_version 1.3 without mtls: set mtls: true"
    ):
        load_ecg_file(p)
