"""meshtax.validate.suite_run and the per-set statistics of meshtax.validate.result: exact
numbers on synthetic cases, one file per case as soon as it is done, resuming, the result read
back from the directory, the Markdown both sets side by side."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.components import IPC
from meshtax.model.sidecar import Mode
from meshtax.model.speed import Speed
from meshtax.validate.result import (
    CaseResult,
    Predicted,
    RunSample,
    error_stats,
    set_summary,
)
from meshtax.validate.suite import SuiteCase
from meshtax.validate.suite_run import SuiteDir, SuiteResult, run_cases
from tests.helpers import flat, profile


def case(
    name: str,
    mode: str,
    lat: tuple[float, float],
    cpu: tuple[float, float],
    error: str | None = None,
) -> CaseResult:
    """A case whose overheads are exactly ``lat[0]`` µs (p50 and p90) and ``cpu[0]`` CPU-µs per
    request on every pair, predicted as ``lat[1]`` and ``cpu[1]``."""
    topo, query = name.split("/")
    if error is not None:
        return CaseResult(topo, query, mode, 100.0, error=error)
    base = RunSample(1000.0, 1500.0, 1100.0, 100, 100.0, 1.0, {"a": 50_000_000}, 0)
    mesh = RunSample(
        1000.0 + lat[0],
        1500.0 + lat[0],
        1100.0 + lat[0],
        100,
        100.0,
        1.0,
        {"a": 50_000_000 + int(cpu[0] * 1e3 * 100)},
        int(cpu[0] * 1e3 * 50),
    )
    pred = Predicted(lat[1], lat[1], lat[1], cpu[1], 10, 1000.0, {"ipc": 1.5}, ("a warning",))
    return CaseResult(topo, query, mode, 100.0, ((base, mesh),) * 6, pred, {"a": mode})


# latency errors +10 %, −20 %, +40 %, +5 %, −50 %; CPU errors +20 %, +20 %, −10 %, +35 %, 0 %
CASES = (
    case("t/a", "tcp", (100, 110), (200, 240)),
    case("t/b", "http", (100, 80), (200, 240)),
    case("u/a", "grpc", (100, 140), (200, 180)),
    case("u/b", "http", (200, 210), (400, 540)),
    case("v/a", "tcp", (100, 50), (300, 300)),
    case("v/b", "grpc", (0, 0), (0, 0), error="RuntimeError: no pods"),
)


def test_error_stats_exact() -> None:
    s = error_stats([0.10, -0.20, 0.40, 0.05, -0.50, math.nan])
    assert s["n"] == 5
    assert s["median_abs_error"] == pytest.approx(0.20)
    assert s["mean_error"] == pytest.approx(-0.03)  # (0.10 − 0.20 + 0.40 + 0.05 − 0.50) / 5
    assert s["p90_abs_error"] == pytest.approx(0.50)  # nearest rank ⌈4.5⌉ = 5th of 5
    assert s["beyond"] == 2 and s["beyond_share"] == pytest.approx(0.4)
    ten = error_stats([i / 10 for i in range(1, 11)])  # |e| 0.1 … 1.0
    assert ten["p90_abs_error"] == pytest.approx(0.9) and ten["median_abs_error"] == 0.55
    assert ten["beyond"] == 7  # 0.4 … 1.0 (0.3 is not beyond 30 %)
    none = error_stats([math.nan])
    assert none["n"] == 0 and math.isnan(none["median_abs_error"])


def test_set_summary_exact() -> None:
    s = set_summary(CASES)
    assert (s["cases"], s["measured"], s["failed"]) == (6, 5, ["v/b (grpc)"])
    lat, cpu, p90 = s["latency"], s["cpu"], s["p90"]
    assert lat["median_abs_error"] == pytest.approx(0.20)
    assert lat["mean_error"] == pytest.approx(-0.03)
    assert lat["p90_abs_error"] == pytest.approx(0.50)
    assert lat["beyond_cases"] == ["u/a (grpc)", "v/a (tcp)"]
    assert lat["worst"] == {"case": "v/a (tcp)", "error": pytest.approx(-0.5)}
    assert p90["median_abs_error"] == pytest.approx(0.20)  # p90 overhead = p50 overhead here
    # CPU: +20, +20, −10, +35, 0 % → |e| sorted 0, 10, 20, 20, 35
    assert cpu["median_abs_error"] == pytest.approx(0.20)
    assert cpu["mean_error"] == pytest.approx(0.13)
    assert (cpu["beyond"], cpu["beyond_cases"]) == (1, ["u/b (http)"])
    assert s["by_mode"]["tcp"]["latency"]["mean_error"] == pytest.approx(-0.20)  # +10, −50
    assert s["by_mode"]["http"]["cpu"]["median_abs_error"] == pytest.approx(0.275)
    assert set(s["by_mode"]) == {"tcp", "http", "grpc"}
    assert s["by_mode"]["grpc"]["latency"]["n"] == 1  # the failed grpc case is not counted


def test_a_meshed_copy_short_of_its_rate_is_flagged_saturated() -> None:
    ok = case("t/a", "http", (100, 150), (200, 200))
    pairs = tuple((b, replace(m, actual_qps=60.0)) for b, m in ok.pairs)
    short = replace(ok, pairs=pairs)
    assert (ok.mesh_rate_share, ok.saturated) == (1.0, False)
    assert (short.mesh_rate_share, short.saturated) == (0.6, True)
    assert "the meshed copy reached only 60% of the 100 requests/s asked" in " ".join(
        short.factors("latency")
    )
    assert set_summary([ok, short])["saturated"] == ["t/a (http)"]
    res = SuiteResult({"name": "t"}, {"calibration": (ok,), "holdout": (short,)})
    assert "| saturated (meshed copy below 95% of the rate) | 0 | 1 | |" in res.markdown()


SPEED = Speed(9000.0, 21000.0, 2.5, "2026-11-23T09:00:00+00:00")


def test_case_documents_read_back_whole() -> None:
    for c in (*CASES, replace(CASES[0], speed=SPEED)):
        back = CaseResult.from_case(json.loads(json.dumps(c.to_case())))
        assert back.error == c.error and back.predicted == c.predicted
        assert back.speed == c.speed
        assert back.comparisons.keys() == c.comparisons.keys()
        for k, v in c.comparisons.items():
            assert back.comparisons[k].error == pytest.approx(v.error)


def _suite_cases() -> list[SuiteCase]:
    out = []
    for c in CASES:
        which = "calibration" if c.topology == "t" else "holdout"
        out.append(SuiteCase(which, c.topology, c.query, Mode(c.mode), 100.0))
    return out


def test_each_case_is_written_when_done_and_an_interrupted_run_resumes(tmp_path: Path) -> None:
    out = SuiteDir(tmp_path / "run")
    out.update_manifest(cases=[c.key for c in _suite_cases()], suite={"name": "t"})
    by_key = {sc.key: c for sc, c in zip(_suite_cases(), CASES, strict=True)}
    calls: list[str] = []

    def runner(sc: SuiteCase) -> CaseResult:
        done = sorted(p.name for p in (tmp_path / "run" / "cases").rglob("*.json"))
        assert len(done) == len(calls)  # every earlier case is on disk before the next starts
        calls.append(sc.key)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return by_key[sc.key]

    with pytest.raises(KeyboardInterrupt):
        run_cases(_suite_cases(), out, runner)
    files = sorted(str(p.relative_to(out.root)) for p in out.root.rglob("*") if p.is_file())
    assert files == [
        "cases/calibration/t-a-tcp.json",
        "cases/calibration/t-b-http.json",
        "manifest.json",
    ]  # no half-written file of the interrupted case
    doc = json.loads(out.case_path(_suite_cases()[0]).read_text())
    assert (
        doc["set"] == "calibration" and doc["key"] == "t/a/tcp" and len(doc["loadavg_after"]) == 3
    )
    part = out.result()
    assert [c.name for c in part.sets["calibration"]] == ["t/a", "t/b"]
    assert part.missing == ("u/a/grpc", "u/b/http", "v/a/tcp", "v/b/grpc")

    calls.clear()
    said: list[str] = []
    got = run_cases(_suite_cases(), out, lambda sc: by_key[sc.key], said.append, resume=True)
    assert [c.name for c in got] == [c.name for c in CASES]
    assert sum("measured before, kept" in m for m in said) == 2
    assert any("FAILED (RuntimeError: no pods)" in m for m in said)
    # a failed case is measured again on the next resume; the measured ones are not
    again: list[str] = []

    def record(sc: SuiteCase) -> CaseResult:
        again.append(sc.key)
        return by_key[sc.key]

    run_cases(_suite_cases(), out, record, resume=True)
    assert again == ["v/b/grpc"]

    res = out.result()
    assert res.missing == () and res.summary()["holdout"]["latency"]["n"] == 3
    assert len(res.case_loads) == 6 and "(1-min after each case: median" in res.markdown()
    assert res.summary()["calibration"]["latency"]["mean_error"] == pytest.approx(-0.05)
    j, md = out.write_summary(res)
    assert json.loads(j.read_text())["summary"]["holdout"]["cases"] == 4
    assert "## holdout set: per case" in md.read_text()


def test_repredict_uses_the_kept_traces_and_each_cases_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every measured case is predicted again from its kept traces with the profile given, at
    the speed recorded for it (None: as measured); a case without traces says so."""
    from meshtax.validate import suite_run

    scs = _suite_cases()[:3]
    out = SuiteDir(tmp_path / "run")
    out.update_manifest(cases=[c.key for c in scs], suite={"name": "t"}, profile={"name": "old"})
    for sc, c, sp in zip(scs, CASES[:3], (SPEED, None, SPEED), strict=True):
        out.write_case(sc, replace(c, speed=sp))
    out.traces.mkdir()
    for sc in scs[:2]:
        (out.traces / f"{sc.stem}.json").write_text("{}")
    seen: list[tuple[str, float, Speed | None]] = []

    def fake(trace: Path, prof: object, sidecars: object, rate: float, **kw: Any) -> Predicted:
        seen.append((Path(trace).name, rate, kw["speed"]))
        return Predicted(1.0, 2.0, 1.5, 3.0, 1)

    monkeypatch.setattr(suite_run, "predict_traces", fake)
    new = profile({Mode.TCP: {IPC: flat(5, 5)}}, name="new")
    res = suite_run.repredict(out, new)
    assert seen == [("t-a-tcp.json", 100.0, SPEED), ("t-b-http.json", 100.0, None)]
    assert [c.predicted for c in res.sets["calibration"]] == [Predicted(1.0, 2.0, 1.5, 3.0, 1)] * 2
    (missing,) = res.sets["holdout"]
    assert missing.predicted is None and "no traces at" in str(missing.error)
    assert res.profile["name"] == "new" and "measured with 'old'" in res.profile["how"]
    seen.clear()
    at_own = suite_run.repredict(out, new, speed=False)
    assert [sp for _, _, sp in seen] == [None, None]
    assert "at the profile's own speed" in at_own.profile["how"]
    assert at_own.options["speed"] == "profile" and res.options["speed"] == "now"


def _describe(pid: int) -> str:
    """A process as ``pid state cmdline``, for a failing assertion to name what was left."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} {state} {cmd.strip()}"


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


@pytest.mark.root
def test_reduced_real_suite_leaves_nothing_behind(tmp_path: Path) -> None:
    """`validate --suite`, reduced: a short http-only profile (accepted unclosed), one small case in
    each set (Hotel Reservation's user query; a topology of the test's own with 16 KB responses,
    no db stand-in, whose tcp sidecars the profile lacks), quick runs on the real
    machine. Both cases are measured and written with their traces, and nothing of the run is
    left: no mtx- namespace, no process, no scratch directory."""
    import os
    import tempfile
    import warnings

    from meshtax.app.measure import Measured, SuiteBackends, SuiteOptions, real_suite_backends
    from meshtax.app.measure import validate_suite as run_suite
    from meshtax.profile.backends import Backends
    from meshtax.profile.build import ClosureWarning
    from meshtax.profile.plan import Plan
    from meshtax.profile.run import ProfileOptions, run_profile
    from meshtax.store.sqlite import ProfileStore
    from meshtax.testbed.system import RealSystem
    from tests.validate.test_run import _missing, _ours

    if _missing() is not None:
        pytest.skip(str(_missing()))
    (tmp_path / "tiny.yaml").write_text(
        "name: tiny\nqueries:\n  page: {service: front, endpoint: page}\nservices:\n"
        "  front:\n    protocol: http\n    endpoints:\n      page:\n        compute_us: 50\n"
        "        response_bytes: 16384\n        stages: [{call: images.Get}]\n"
        "  images:\n    endpoints:\n      Get: {compute_us: 40, response_bytes: 16384}\n"
    )
    (tmp_path / "suite.yaml").write_text(
        "defaults: {modes: [http], rate: 100}\n"
        "calibration:\n  - {topology: hotel-reservation, query: user}\n"
        "holdout:\n  - {topology: tiny.yaml, query: page}\n"
    )
    store = ProfileStore(tmp_path / "p.db")
    plan = Plan(
        modes=(Mode.HTTP,),
        sizes=(100, 1024),
        rate_fractions=(0.5,),
        low_rates=(100.0,),
        latency_run_s=0.5,
        latency_min_runs=4,
        latency_max_runs=4,
        probe_run_s=1.0,
        maxqps_run_s=0.5,
        cpu_run_s=0.5,
        warmup_n=100,
    )

    def short_profile(name: str | None, say: object) -> Measured:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ClosureWarning)  # a noisy shared machine
            p = run_profile(
                ProfileOptions(name=name, plan=plan),
                RealSystem(),
                store,
                backends=Backends(lock_timeout=300.0),
            )
        return Measured(p, ())

    netns, scratch = _ours(), set(Path(tempfile.gettempdir()).glob("meshtax-*"))
    kids = set(_descendants(os.getpid()))  # an earlier test's processes are not this run's
    opts = SuiteOptions(
        str(tmp_path / "out"),
        str(tmp_path / "suite.yaml"),
        quick=True,
        name="ci-suite",
        accept_unclosed=True,  # a reduced profile on a shared machine need not close
        speed="now",  # the real reference workload before each prediction
    )
    be = SuiteBackends(short_profile, real_suite_backends(store, 300.0).cases)
    res = run_suite(opts, store, backends=be)
    cases = [*res.sets["calibration"], *res.sets["holdout"]]
    assert [(c.name, c.error) for c in cases] == [
        ("hotel-reservation/user", None),
        ("tiny/page", None),
    ]
    assert all(c.comparisons["cpu"].measured.median > 0 for c in cases)
    # each case predicted at the machine's speed measured for it, or says why not
    assert all(
        c.speed is not None
        or any("speed not measured" in w for w in (c.predicted.warnings if c.predicted else ()))
        for c in cases
    )
    out = tmp_path / "out"
    assert sorted(p.name for p in (out / "traces").iterdir()) == [
        "hotel-reservation-user-http.json",
        "tiny-page-http.json",
    ]
    assert (out / "summary.md").is_file() and not list(out.rglob(".*.tmp"))
    assert set(_ours()) <= set(netns)  # a dead run's leftovers may have been reaped meanwhile
    assert [_describe(p) for p in set(_descendants(os.getpid())) - kids] == []
    mine = f".{os.getpid()}."
    left = set(Path(tempfile.gettempdir()).glob("meshtax-*")) - scratch
    assert not [p for p in left if mine in p.name], left


def test_calibrate_fits_on_the_calibration_set_only_and_predicts_every_case_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transfer comes from the calibration cases alone — their measured CPU less the part
    of the prediction no factor scales, over each model's part (found by predicting with that
    model's factor 2) — and every case is predicted again with it; the leave-one-topology-out
    errors come with it."""
    from meshtax.model.profile import ModeProfile
    from meshtax.validate import suite_run

    scs = _suite_cases()[:5]  # calibration: t/a tcp, t/b http; hold-out: u/a, u/b, v/a
    out = SuiteDir(tmp_path / "run")
    out.update_manifest(cases=[c.key for c in scs], suite={"name": "t"}, profile={"name": "p"})
    out.traces.mkdir()
    for sc, c in zip(scs, CASES[:5], strict=True):
        out.write_case(sc, c)
        (out.traces / f"{sc.stem}.json").write_text("{}")
    # per case: CPU predicted = the factor of its mode's model × its part + 20 (idle, fixed)
    part = {
        "t-a-tcp": 110.0,
        "t-b-http": 90.0,
        "u-a-grpc": 160.0,
        "u-b-http": 200.0,
        "v-a-tcp": 100.0,
    }

    def fake(trace: Path, prof: Any, sidecars: Any, rate: float, **kw: Any) -> Predicted:
        stem = Path(trace).stem
        k, t = stem.rsplit("-", 1)[1], prof.transfer
        cpu = (t.factor(k) if t else 1.0) * part[stem] + 20.0
        lat = (t.latency_factor(k) if t else 1.0) * part[stem] + 20.0
        return Predicted(lat, lat, lat, cpu, 1)

    monkeypatch.setattr(suite_run, "predict_traces", fake)
    tcp = ModeProfile(Mode.TCP, {IPC: flat(5, 5)}, carried={"grpc": ModeProfile(Mode.TCP, {})})
    prof = replace(
        profile({m: {IPC: flat(5, 5)} for m in Mode}, name="p"),
        modes={m: tcp if m is Mode.TCP else ModeProfile(m, {IPC: flat(5, 5)}) for m in Mode},
    )
    assert suite_run.model_keys(prof) == ["tcp", "tcp+grpc", "http", "grpc"]
    assert suite_run.model_keys(prof, per_model=False) == ["tcp", "http", "grpc"]
    got = suite_run.calibrate(out, prof)
    t = got.profile.transfer
    assert t is not None and set(t.factors) == {"tcp", "http"}  # no grpc case calibrated
    assert t.factor("tcp") == pytest.approx((200 - 20) / 110)  # t/a measured 200 CPU-µs
    assert t.factor("http") == pytest.approx((200 - 20) / 90)
    assert t.factor("grpc") == 1.0
    # latency's own factors, the same way from the cases' latency p50 (t/a and t/b measured 100)
    assert t.latency_factor("tcp") == pytest.approx((100 - 20) / 110)
    assert t.latency_factor("http") == pytest.approx((100 - 20) / 90)
    hold = {c.name: c.predicted for c in got.result.sets["holdout"]}
    assert hold["u/b"] is not None and hold["u/b"].cpu_us_per_request == pytest.approx(2 * 200 + 20)
    assert hold["u/b"].p50_us == pytest.approx(80 / 90 * 200 + 20)
    no_lat = suite_run.calibrate(out, prof, latency=False).profile.transfer  # at the CPU's
    assert no_lat is not None and not no_lat.latency
    assert hold["v/a"] is not None
    assert hold["v/a"].cpu_us_per_request == pytest.approx(180 / 110 * 100 + 20)
    assert got.result.profile["transfer"] == t.to_dict()
    assert "Fitted to the calibration set only" in "\n".join(got.result.header())
    # one calibration topology ("t"): left out, nothing remains to fit → factor 1
    assert got.loto == pytest.approx([130 / 200 - 1, 110 / 200 - 1])
