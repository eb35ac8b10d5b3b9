"""meshtax.validate.suite: the bundled suite (cases, split, what its topologies exercise) and the
suite file's checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtax.model.sidecar import Mode
from meshtax.validate import appctl
from meshtax.validate.suite import DEFAULT_SUITE, SETS, SuiteError, load_suite


def test_bundled_suite_loads_with_a_real_hold_out() -> None:
    s = load_suite()
    assert s.path == DEFAULT_SUITE and s.split == "topology"
    assert len(s.cases) >= 30
    keys = [c.key for c in s.cases]
    assert len(set(keys)) == len(keys)
    cal, hold = s.of("calibration"), s.of("holdout")
    assert cal and hold and len(cal) + len(hold) == len(s.cases)
    assert not {c.key for c in cal} & {c.key for c in hold}
    # whole topologies held out: nothing fitted on the calibration set saw a hold-out app
    assert not set(s.topology_names("calibration")) & set(s.topology_names("holdout"))
    assert len(s.topologies) >= 6 and "chain" not in s.topologies
    for c in s.cases:  # every topology and query exists, in the bundled directory
        topo = appctl.load_topology(c.topology)
        assert topo.path.parent == appctl.TOPOLOGY_DIR and c.query in topo.queries
        assert c.rate > 0
    for which in SETS:  # each set sees every mode
        assert {c.mode for c in s.of(which)} == set(Mode)
    assert s.describe()["sets"]["holdout"]["cases"] == len(hold)


def _features(topo: appctl.Topology, query: str) -> set[str]:
    """What one query exercises, read off its call tree."""
    q = topo.query(query)
    out: set[str] = set()
    protocols = set()

    def walk(svc: str, ep: str, in_parallel: bool) -> None:
        s = topo.services[svc]
        e = s.endpoints[ep]
        protocols.add(s.protocol)
        if e.compute == "sleep":
            out.add("sleep")
        if e.response_bytes >= 4096:
            out.add("large")
        db_stages = [st for st in e.stages if len(st) == 1 and topo.services[st[0].service].role]
        if len(db_stages) >= 2:
            out.add("sequential db writes")
        for st in e.stages:
            if len(st) >= 8:
                out.add("wide fan-out")
            if len(st) >= 2 and in_parallel:
                out.add("nested fan-out")
            for c in st:
                walk(c.service, c.endpoint, in_parallel or len(st) >= 2)

    walk(q.service, q.endpoint, False)
    if len(protocols) > 1:
        out.add("mixed protocols")
    return out


def test_suite_topologies_exercise_what_the_issue_asks() -> None:
    s = load_suite()
    seen: set[str] = set()
    for c in s.cases:
        seen |= _features(s.topologies[c.topology], c.query)
    want = {"wide fan-out", "nested fan-out", "large", "mixed protocols", "sleep"}
    assert want | {"sequential db writes"} <= seen
    # and writes through services, one after another, after a parallel stage
    compose = s.topologies["social-network"].services["compose-post"].endpoints["ComposePost"]
    assert [len(st) for st in compose.stages] == [3, 1, 1, 1]
    sizes = [
        e.response_bytes
        for t in s.topologies.values()
        for v in t.services.values()
        for e in v.endpoints.values()
    ]
    assert max(sizes) == 32768 and any(4096 <= x < 32768 for x in sizes)
    # realistic compute: spin 10–300 µs; I/O stand-ins wait instead
    for t in s.topologies.values():
        for v in t.services.values():
            for e in v.endpoints.values():
                if e.compute == "spin":
                    assert 10 <= e.compute_us <= 300, (t.name, v.name, e.name)


@pytest.mark.parametrize("name", ["social-network", "media", "search", "order-pipeline"])
def test_new_topologies_say_what_they_model(name: str) -> None:
    text = (appctl.TOPOLOGY_DIR / f"{name}.yaml").read_text().splitlines()
    comment = [line for line in text[:12] if line.startswith("#")]
    assert len(comment) >= 4, f"{name}: the file starts with a comment saying what it models"


def _write(tmp: Path, body: str) -> Path:
    p = tmp / "s.yaml"
    p.write_text(body)
    return p


def test_defaults_overrides_and_local_topologies(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        (appctl.TOPOLOGY_DIR / "bookinfo.yaml").read_text().replace("name: bookinfo", "name: mine")
    )
    p = _write(
        tmp_path,
        """
name: t
defaults: {modes: [http], rate: 80, duration_s: 2}
calibration:
  - {topology: mine.yaml, query: productpage, modes: [tcp, grpc], rate: 40}
holdout:
  - {topology: media, query: poster}
""",
    )
    s = load_suite(p)
    assert (s.name, s.rate, s.duration_s) == ("t", 80.0, 2.0)
    assert [(c.set, c.key, c.rate) for c in s.cases] == [
        ("calibration", "mine/productpage/tcp", 40.0),
        ("calibration", "mine/productpage/grpc", 40.0),
        ("holdout", "media/poster/http", 80.0),
    ]
    assert s.topologies["mine"].path == tmp_path / "mine.yaml"
    assert s.of("holdout")[0].stem == "media-poster-http"
    with pytest.raises(SuiteError, match="no set"):
        s.of("test")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        """
name: t
colour: blue
defaults: {modes: [quic], rate: -1}
calibration:
  - {topology: bookinfo, query: productpage, modes: [http], speed: 2}
  - {topology: nope, query: x}
  - {topology: bookinfo, query: nope}
  - {topology: bookinfo, query: productpage, modes: [http]}
holdout:
  - {topology: bookinfo, query: productpage, modes: [http, grpc]}
  - {query: poster}
""",
    )
    with pytest.raises(SuiteError) as e:
        load_suite(p)
    msg = str(e.value)
    for part in (
        "colour: unknown field",
        "defaults.modes: ['quic'] is not a list of modes",
        "defaults.rate: -1 is not a rate",
        "calibration[0].speed: unknown field",
        "calibration[1]: no topology 'nope'",
        "calibration[2]: topology bookinfo has no query 'nope'",
        "case bookinfo/productpage/http twice in calibration",
        "case bookinfo/productpage/http in both sets",
        "holdout[1]: no topology",
        "split: topology, but bookinfo in both sets",
    ):
        assert part in msg, (part, msg)


def test_interleaved_order_spreads_each_set_over_the_sitting(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        """
defaults: {modes: [http]}
calibration:
  - {topology: bookinfo, query: productpage}
  - {topology: media, query: poster}
holdout:
  - {topology: search, query: results, modes: [tcp, http, grpc]}
  - {topology: order-pipeline, query: checkout}
""",
    )
    s = load_suite(p)
    got = [c.key for c in s.in_order()]
    # calibration at 1/4, 3/4 of the sitting; hold-out at 1/8, 3/8, 5/8, 7/8
    assert got == [
        "search/results/tcp",
        "bookinfo/productpage/http",
        "search/results/http",
        "search/results/grpc",
        "media/poster/http",
        "order-pipeline/checkout/http",
    ]
    assert s.in_order(order="sets") == s.cases
    assert s.in_order(("holdout",)) == s.of("holdout")
    # every case once, each set in its file order
    assert sorted(got) == sorted(c.key for c in s.cases)
    with pytest.raises(SuiteError, match="no order 'random'"):
        s.in_order(order="random")


def test_bundled_suite_interleaved_keeps_the_sets_drift_alike() -> None:
    s = load_suite(DEFAULT_SUITE)
    pos = {c.key: i for i, c in enumerate(s.in_order())}
    n = len(pos)
    mean = {w: sum(pos[c.key] for c in s.of(w)) / len(s.of(w)) / (n - 1) for w in SETS}
    # set after set, the calibration set's mean position is ~0.2 and the hold-out's ~0.7
    assert abs(mean["calibration"] - mean["holdout"]) < 0.05, mean


def test_split_by_case_allows_a_topology_in_both_sets(tmp_path: Path) -> None:
    body = """
split: {split}
calibration:
  - {{topology: bookinfo, query: productpage, modes: [http]}}
holdout:
  - {{topology: bookinfo, query: productpage, modes: [grpc]}}
"""
    assert len(load_suite(_write(tmp_path, body.format(split="case"))).cases) == 2
    with pytest.raises(SuiteError, match="bookinfo in both sets"):
        load_suite(_write(tmp_path, body.format(split="topology")))
    with pytest.raises(SuiteError, match="split: 'random'"):
        load_suite(_write(tmp_path, body.format(split="random")))


def test_empty_or_unreadable_suites(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="holdout: expected a non-empty list"):
        load_suite(_write(tmp_path, "calibration:\n  - {topology: bookinfo, query: productpage}\n"))
    with pytest.raises(SuiteError, match="cannot read"):
        load_suite(tmp_path / "missing.yaml")
    with pytest.raises(SuiteError, match="expected a mapping"):
        load_suite(_write(tmp_path, "- 1\n"))
