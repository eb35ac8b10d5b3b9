"""meshtax.app.measure.validate_suite with fake backends: the order of the steps, the
calibration step sees the calibration set only, resuming skips what is done, an interrupted run
keeps its summary, bad options are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshtax.app import UsageError
from meshtax.app.measure import (
    CALIBRATIONS,
    Calibrated,
    CalibrationInput,
    Measured,
    SuiteBackends,
    SuiteOptions,
    validate_suite,
)
from meshtax.model.components import IPC
from meshtax.model.profile import Colocation
from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.result import CaseResult, Predicted, RunSample
from meshtax.validate.suite import SuiteCase
from tests.helpers import flat, profile

SUITE = """
name: small
defaults: {modes: [http], rate: 80, duration_s: 2}
calibration:
  - {topology: bookinfo, query: productpage}
holdout:
  - {topology: media, query: poster, modes: [http, grpc]}
"""


def _result(c: SuiteCase) -> CaseResult:
    base = RunSample(1000.0, 1500.0, 1100.0, 100, 80.0, 2.0, {"x": 10_000_000})
    mesh = RunSample(1200.0, 1800.0, 1300.0, 100, 80.0, 2.0, {"x": 30_000_000})
    pred = Predicted(220.0, 330.0, 220.0, 180.0, 12)
    return CaseResult(c.topology, c.query, c.mode.value, c.rate, ((base, mesh),) * 6, pred)


class Fakes:
    """Records what each step was asked; ``interrupt_at``: the case number that Ctrl-Cs."""

    def __init__(self, store: ProfileStore, interrupt_at: int = 0) -> None:
        self.store = store
        self.profiled: list[str | None] = []
        self.cases: list[str] = []
        self.calibrated: list[CalibrationInput] = []
        self.interrupt_at = interrupt_at

    def backends(self) -> SuiteBackends:
        def prof(name: str | None, say: object) -> Measured:
            self.profiled.append(name)
            p = profile({Mode.HTTP: {IPC: flat(5, 5)}}, name=name or "generated")
            self.store.save(p)  # as the real profiler does
            return Measured(p, ("http closes within 9 %",))

        def cases(p: object, suite: object, opts: object, out: object, say: object) -> object:
            def run(c: SuiteCase) -> CaseResult:
                self.cases.append(c.key)
                if len(self.cases) == self.interrupt_at:
                    raise KeyboardInterrupt
                return _result(c)

            return run

        return SuiteBackends(prof, cases)  # type: ignore[arg-type]

    def calibrate(self, inp: CalibrationInput, store: ProfileStore, say: object) -> Calibrated:
        self.calibrated.append(inp)
        col = Colocation(0.5, 0.4, 0.6, "http", inp.rate, (), "fake")
        p = inp.profile
        cal = type(p)(p.name, p.platform, p.provenance, p.modes, {Mode.HTTP: col})
        store.save(cal, replace=True)
        return Calibrated(cal, "fake: α http 0.50", {"http": col.to_dict()})


@pytest.fixture
def setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, ProfileStore, Fakes, SuiteOptions]:
    (tmp_path / "suite.yaml").write_text(SUITE)
    store = ProfileStore(tmp_path / "p.db")
    fakes = Fakes(store)
    monkeypatch.setitem(CALIBRATIONS, "fake", fakes.calibrate)
    opts = SuiteOptions(
        str(tmp_path / "out"), str(tmp_path / "suite.yaml"), name="p1", calibration="fake"
    )
    return tmp_path, store, fakes, opts


def test_profile_calibration_then_both_sets(
    setup: tuple[Path, ProfileStore, Fakes, SuiteOptions],
) -> None:
    tmp, store, fakes, opts = setup
    said: list[str] = []
    res = validate_suite(opts, store, said.append, backends=fakes.backends())
    assert fakes.profiled == ["p1"]
    (inp,) = fakes.calibrated
    # the calibration step sees the calibration set and nothing of the hold-out
    assert [c.key for c in inp.cases] == ["bookinfo/productpage/http"]
    assert (inp.profile.name, inp.rate, inp.duration_s, inp.quick) == ("p1", 80.0, 2.0, False)
    assert fakes.cases == ["bookinfo/productpage/http", "media/poster/http", "media/poster/grpc"]
    assert [c.name for c in res.sets["holdout"]] == ["media/poster", "media/poster"]
    out = tmp / "out"
    man = json.loads((out / "manifest.json").read_text())
    assert man["profile"]["name"] == "p1" and man["profile"]["warnings"] == [
        "http closes within 9 %"
    ]
    assert man["calibration"]["summary"] == "fake: α http 0.50"
    assert man["options"] == {
        "duration_s": 2.0,
        "quick": False,
        "rates": "80",
        "calibration": "fake",
    }
    doc = json.loads((out / "summary.json").read_text())
    assert doc["summary"]["holdout"]["latency"]["median_abs_error"] == pytest.approx(0.10)
    assert store.get("p1").alpha(Mode.HTTP) == 0.5  # the cases ran on the calibrated profile
    case_doc = json.loads((out / "cases/holdout/media-poster-grpc.json").read_text())
    assert case_doc["profile"] == "p1"
    md = (out / "summary.md").read_text()
    assert "Calibration step `fake`: fake: α http 0.50." in md
    assert any(m.startswith("[3/3] holdout media/poster/grpc: latency") for m in said)
    with pytest.raises(UsageError, match="holds a suite run already: --resume"):
        validate_suite(opts, store, backends=fakes.backends())


def test_interrupted_run_keeps_its_cases_and_resumes(
    setup: tuple[Path, ProfileStore, Fakes, SuiteOptions],
) -> None:
    tmp, store, fakes, opts = setup
    fakes.interrupt_at = 2
    with pytest.raises(KeyboardInterrupt):
        validate_suite(opts, store, backends=fakes.backends())
    md = (tmp / "out" / "summary.md").read_text()
    assert "Not measured (yet): 2 case(s): media/poster/http, media/poster/grpc." in md
    fakes.interrupt_at = 0
    fakes.cases.clear()
    resume = SuiteOptions(opts.out, opts.suite, name="p1", calibration="fake", resume=True)
    res = validate_suite(resume, store, backends=fakes.backends())
    # neither the profile nor the calibration again; only the cases not measured
    assert fakes.profiled == ["p1"] and len(fakes.calibrated) == 1
    assert fakes.cases == ["media/poster/http", "media/poster/grpc"]
    assert res.missing == () and len(res.sets["calibration"]) == 1
    with pytest.raises(UsageError, match="resume with the same options"):
        validate_suite(
            SuiteOptions(opts.out, opts.suite, duration_s=5.0, calibration="fake", resume=True),
            store,
            backends=fakes.backends(),
        )


def test_a_stored_profile_and_one_set(
    setup: tuple[Path, ProfileStore, Fakes, SuiteOptions],
) -> None:
    tmp, store, fakes, _ = setup
    store.save(profile({Mode.HTTP: {IPC: flat(5, 5)}}, name="old"))
    opts = SuiteOptions(
        str(tmp / "o2"),
        str(tmp / "suite.yaml"),
        sets=("holdout",),
        rate=50.0,
        profile="old",
        calibration="none",
    )
    res = validate_suite(opts, store, backends=fakes.backends())
    assert fakes.profiled == [] and fakes.calibrated == []
    assert fakes.cases == ["media/poster/http", "media/poster/grpc"]
    assert {c.rate for c in res.sets["holdout"]} == {50.0} and res.sets["calibration"] == ()
    assert res.profile["how"] == "stored earlier, not this sitting"
    assert res.calibration["summary"].startswith("none: the profile as stored (α http 1.00")


def test_bad_options_and_suites(setup: tuple[Path, ProfileStore, Fakes, SuiteOptions]) -> None:
    tmp, store, fakes, opts = setup
    with pytest.raises(UsageError, match="--sets"):
        SuiteOptions("o", sets=("training",))
    with pytest.raises(UsageError, match="--calibration"):
        SuiteOptions("o", calibration="magic")
    with pytest.raises(UsageError, match="not both"):
        SuiteOptions("o", name="a", profile="b")
    (tmp / "bad.yaml").write_text("calibration: []\nholdout: []\n")
    with pytest.raises(UsageError, match="calibration: expected a non-empty list"):
        validate_suite(SuiteOptions("o", str(tmp / "bad.yaml")), store, backends=fakes.backends())
