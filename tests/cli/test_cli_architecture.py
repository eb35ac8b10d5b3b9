"""``meshtax predict --architecture a,b --pods-per-node N``: an ECG with nodes and per-service
architectures, read from YAML, compared side by side in text, JSON and CSV; the numbers are
the pure core's (predict.architecture) on the same graph and profile."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from meshtax.cli import main
from meshtax.model.components import READ, TLS
from meshtax.model.ecg import to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Architecture, Mode
from meshtax.predict.architecture import predict_architecture
from meshtax.predict.engine import single_profile
from meshtax.store.reference import reference_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host
from meshtax.traces.ecg_file import load_ecg_file
from tests.helpers import flat, profile

ECG = """\
name: shop
services:
  front: {sidecar: http, node: a}
  cart: {sidecar: http, node: a}
  pay: {sidecar: http, node: b}
  legacy: {sidecar: http, node: b, architecture: sidecar}
invocations:
  - {id: r, callee: front, start_us: 0, duration_us: 1000}
  - {id: c, parent: r, callee: cart, start_us: 10, duration_us: 200}
  - {id: p, parent: r, callee: pay, start_us: 300, duration_us: 200}
  - {id: l, parent: r, callee: legacy, start_us: 600, duration_us: 200}
"""


@pytest.fixture
def ecg_file(tmp_path: Path) -> Path:
    p = tmp_path / "shop.yaml"
    p.write_text(ECG)
    return p


def run(args: list[str], tmp_path: Path) -> str:
    r = CliRunner().invoke(main, args, env={"MESHTAX_DB": str(tmp_path / "p.db")})
    assert r.exit_code == 0, r.output
    return r.output


def test_yaml_carries_nodes_and_architectures(ecg_file: Path) -> None:
    (g,) = load_ecg_file(ecg_file)
    assert g.services["cart"].node == "a" and g.services["front"].architecture is None
    assert g.services["legacy"].architecture is Architecture.SIDECAR


def test_predict_compares_architectures(ecg_file: Path, tmp_path: Path) -> None:
    args = ["predict", str(ecg_file), "--profile", "reference"]
    arch = ["--architecture", "sidecar,node-l4,waypoint"]
    doc = json.loads(run([*args, *arch, "--format", "json"], tmp_path))
    rows = {a["architecture"]: a for a in doc["architectures"]["by_architecture"]}
    assert list(rows) == ["sidecar", "node-l4", "waypoint"]
    # the pure core on the same graph: the CLI reports exactly its numbers
    batch = to_batch(load_ecg_file(ecg_file))
    look = single_profile(reference_profile())
    for name, row in rows.items():
        _, p = predict_architecture(batch, look, name)
        assert row["graphs"][0]["latency_overhead_us"]["value"] == pytest.approx(
            float(p.latency_overhead_us[0])
        )
        assert row["graphs"][0]["cpu_vcpu"]["value"] == pytest.approx(float(p.cpu_vcpu[0]))
    # legacy keeps its sidecar; two nodes carry node proxies
    assert rows["node-l4"]["services"] == {"node-l4": 3, "sidecar": 1}
    assert rows["node-l4"]["node_proxies"] == 2 and rows["sidecar"]["node_proxies"] == 0
    lat = {n: r["graphs"][0]["latency_overhead_us"]["value"] for n, r in rows.items()}
    assert lat["node-l4"] < lat["waypoint"] and lat["node-l4"] < lat["sidecar"]
    # the main prediction is the first architecture's
    assert doc["graphs"][0]["latency_overhead_us"]["value"] == pytest.approx(lat["sidecar"])

    text = run([*args, *arch], tmp_path)
    assert "architectures (pods per node for unplaced services: 1)" in text
    header = next(
        ln for ln in text.splitlines() if ln.split() == ["sidecar", "node-l4", "waypoint"]
    )
    assert header and "stand-in for ztunnel, not ztunnel" in text

    table = list(csv.DictReader(io.StringIO(run([*args, *arch, "--format", "csv"], tmp_path))))
    assert [(r["architecture"], r["graph"]) for r in table] == [
        ("sidecar", "shop"),
        ("node-l4", "shop"),
        ("waypoint", "shop"),
    ]
    assert float(table[1]["latency_overhead_us"]) == pytest.approx(lat["node-l4"])


def test_none_alone_leaves_only_the_service_that_keeps_its_sidecar(
    ecg_file: Path, tmp_path: Path
) -> None:
    args = ["predict", str(ecg_file), "--profile", "reference", "--architecture", "none"]
    doc = json.loads(run([*args, "--format", "json"], tmp_path))
    (row,) = doc["architectures"]["by_architecture"]
    assert row["architecture"] == "none" and row["services"] == {"none": 3, "sidecar": 1}
    # front → legacy still crosses legacy's sidecar (inbound), nothing else does
    _, p = predict_architecture(
        to_batch(load_ecg_file(ecg_file)), single_profile(reference_profile()), "none"
    )
    lat = doc["graphs"][0]["latency_overhead_us"]["value"]
    assert lat == pytest.approx(float(p.latency_overhead_us[0])) and lat > 0
    assert float(p.row_latency_caller_us.sum()) == 0.0  # front has no proxy of its own


def test_bad_architecture_is_a_user_error(ecg_file: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(
        main,
        ["predict", str(ecg_file), "--profile", "reference", "--architecture", "ambient"],
        env={"MESHTAX_DB": str(tmp_path / "p.db")},
    )
    assert r.exit_code == 2 and "unknown architecture 'ambient'" in r.output


def test_report_shows_one_comparison_figure(ecg_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    args = ["predict", str(ecg_file), "--profile", "reference", "--report", str(out)]
    run([*args, "--architecture", "sidecar,node-l4,waypoint"], tmp_path)
    html = out.read_text()
    assert html.count('data-kind="architectures"') == 1 and "<h3>Architectures</h3>" in html
    assert "stand-in for ztunnel, not ztunnel" in html
    run(args, tmp_path)  # no comparison asked: no figure
    assert 'data-kind="architectures"' not in out.read_text()


def _role_profile(name: str, role: str, modes: list[Mode]) -> Profile:
    """A profile of this machine measured in ``role``: 2 µs / 3 CPU-µs per crossing in every
    mode (the node proxy's inter-node part: 1 / 1)."""
    comps = {m: {READ: flat(2.0, 3.0)} for m in modes}
    if Mode.TCP in comps:
        comps[Mode.TCP][TLS] = flat(1.0, 1.0)
    p = profile(comps, name=name)
    plat = replace(this_host("envoy", "1.40.0", "k"), architecture=role)
    return replace(p, platform=plat)


def test_predict_prices_roles_from_this_machines_role_profiles(
    ecg_file: Path, tmp_path: Path
) -> None:
    store = ProfileStore(tmp_path / "p.db")
    store.save(_role_profile("nl4", "node-l4", [Mode.TCP]))
    store.save(_role_profile("wp", "waypoint", list(Mode)))
    args = ["predict", str(ecg_file), "--profile", "reference", "--format", "json"]
    doc = json.loads(run([*args, "--architecture", "node-l4,waypoint"], tmp_path))
    sec = doc["architectures"]
    assert sec["role_profiles"] == {"node-l4": "nl4", "waypoint": "wp"}
    assert "profile 'nl4', measured as Envoy per node" in sec["roles"]
    assert any("priced from 'nl4' (this machine's newest)" in w for w in doc["warnings"])
    # the pure core with those roles: the CLI reports its numbers
    batch = to_batch(load_ecg_file(ecg_file))
    look = single_profile(reference_profile(), {"nl4": store.get("nl4"), "wp": store.get("wp")})
    roles = {Architecture.NODE_L4: "nl4", Architecture.WAYPOINT: "wp"}
    for row in sec["by_architecture"]:
        _, p = predict_architecture(batch, look, row["architecture"], roles=roles)
        assert row["graphs"][0]["latency_overhead_us"]["value"] == pytest.approx(
            float(p.latency_overhead_us[0])
        )
    # a sidecar profile is not a role's, and is refused as one
    r = CliRunner().invoke(
        main,
        [*args, "--architecture", "node-l4", "--node-profile", "reference"],
        env={"MESHTAX_DB": str(tmp_path / "p.db")},
    )
    assert r.exit_code != 0 and "is not a node-l4 profile" in r.output
