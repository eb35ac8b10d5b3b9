"""meshtax.app.measure.validate_suite with fake backends: the order of the steps (profile, then
the calibration set, then the hold-out), resuming skips what is done, an interrupted run keeps
its summary, an unclosed profile is refused unless accepted, bad options are refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshtax.app import UsageError
from meshtax.app.measure import (
    Measured,
    SuiteBackends,
    SuiteOptions,
    validate_suite,
)
from meshtax.errors import StoreError
from meshtax.model.components import IPC
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
        self.interrupt_at = interrupt_at
        self.status: str | None = None  # the status the fake profiler stores
        self.store_it = True  # False: the profile measured is not in the store (refused)
        self.refuse_first = False  # True: only the first profile measured is not stored

    def backends(self) -> SuiteBackends:
        def prof(name: str | None, say: object) -> Measured:
            self.profiled.append(name)
            p = profile({Mode.HTTP: {IPC: flat(5, 5)}}, name=name or "generated")
            p = replace(p, status=self.status)
            first = len(self.profiled) == 1
            if self.store_it and not (self.refuse_first and first):
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


@pytest.fixture
def setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, ProfileStore, Fakes, SuiteOptions]:
    (tmp_path / "suite.yaml").write_text(SUITE)
    store = ProfileStore(tmp_path / "p.db")
    fakes = Fakes(store)
    opts = SuiteOptions(str(tmp_path / "out"), str(tmp_path / "suite.yaml"), name="p1")
    return tmp_path, store, fakes, opts


def test_profile_then_both_sets(
    setup: tuple[Path, ProfileStore, Fakes, SuiteOptions],
) -> None:
    tmp, store, fakes, opts = setup
    said: list[str] = []
    res = validate_suite(opts, store, said.append, backends=fakes.backends())
    assert fakes.profiled == ["p1"]
    # the sets interleaved: hold-out at 1/4 and 3/4 of the sitting, calibration at 1/2
    assert fakes.cases == ["media/poster/http", "bookinfo/productpage/http", "media/poster/grpc"]
    assert [c.name for c in res.sets["holdout"]] == ["media/poster", "media/poster"]
    out = tmp / "out"
    man = json.loads((out / "manifest.json").read_text())
    assert man["profile"]["name"] == "p1" and man["profile"]["warnings"][0] == (
        "http closes within 9 %"
    )
    assert man["profile"]["quality"]["status"] == "unchecked"
    assert "calibration" not in man
    assert man["options"] == {
        "duration_s": 2.0,
        "quick": False,
        "rates": "80",
        "speed": "now",
        "order": "interleaved",
    }
    doc = json.loads((out / "summary.json").read_text())
    assert doc["summary"]["holdout"]["latency"]["median_abs_error"] == pytest.approx(0.10)
    case_doc = json.loads((out / "cases/holdout/media-poster-grpc.json").read_text())
    assert case_doc["profile"] == "p1"
    md = (out / "summary.md").read_text()
    assert "Nothing is fitted to either set" in md
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
    assert "Not measured (yet): 2 case(s): bookinfo/productpage/http, media/poster/grpc." in md
    fakes.interrupt_at = 0
    fakes.cases.clear()
    resume = SuiteOptions(opts.out, opts.suite, name="p1", resume=True)
    res = validate_suite(resume, store, backends=fakes.backends())
    # not the profile again; only the cases not measured
    assert fakes.profiled == ["p1"]
    assert fakes.cases == ["bookinfo/productpage/http", "media/poster/grpc"]
    assert res.missing == () and len(res.sets["calibration"]) == 1
    with pytest.raises(UsageError, match="resume with the same options"):
        validate_suite(
            SuiteOptions(opts.out, opts.suite, duration_s=5.0, resume=True),
            store,
            backends=fakes.backends(),
        )


def test_set_after_set_and_a_run_from_before_the_order_was_recorded(
    setup: tuple[Path, ProfileStore, Fakes, SuiteOptions],
) -> None:
    tmp, store, fakes, opts = setup
    fakes.interrupt_at = 2
    with pytest.raises(KeyboardInterrupt):
        validate_suite(replace(opts, order="sets"), store, backends=fakes.backends())
    assert fakes.cases == ["bookinfo/productpage/http", "media/poster/http"]
    man_path = tmp / "out" / "manifest.json"
    man = json.loads(man_path.read_text())
    del man["options"]["order"]  # as suite runs 1–11 wrote it
    man_path.write_text(json.dumps(man))
    fakes.interrupt_at = 0
    fakes.cases.clear()
    with pytest.raises(UsageError, match="resume with the same options"):
        validate_suite(replace(opts, resume=True), store, backends=fakes.backends())
    validate_suite(replace(opts, resume=True, order="sets"), store, backends=fakes.backends())
    assert fakes.cases == ["media/poster/http", "media/poster/grpc"]
    with pytest.raises(UsageError, match="--order: 'random'"):
        replace(opts, order="random")


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
    )
    res = validate_suite(opts, store, backends=fakes.backends())
    assert fakes.profiled == []
    assert fakes.cases == ["media/poster/http", "media/poster/grpc"]
    assert {c.rate for c in res.sets["holdout"]} == {50.0} and res.sets["calibration"] == ()
    assert res.profile["how"] == "stored earlier, not this sitting"


def test_an_unclosed_profile_is_refused_unless_accepted(
    setup: tuple[Path, ProfileStore, Fakes, SuiteOptions],
) -> None:
    tmp, store, fakes, opts = setup
    fakes.status = "unclosed"
    with pytest.raises(UsageError, match="is unclosed. Not validating with it"):
        validate_suite(opts, store, backends=fakes.backends())
    assert fakes.cases == []  # nothing measured with it
    man = json.loads((tmp / "out" / "manifest.json").read_text())
    assert man["profile"]["quality"]["status"] == "unclosed"  # but the record says why
    again = SuiteOptions(opts.out, opts.suite, resume=True, accept_unclosed=True)
    res = validate_suite(again, store, backends=fakes.backends())
    assert fakes.profiled == ["p1"] and len(fakes.cases) == 3 and res.missing == ()


def test_a_profile_the_store_refuses_is_measured_once_more(
    setup: tuple[Path, ProfileStore, Fakes, SuiteOptions],
) -> None:
    tmp, store, fakes, opts = setup
    fakes.store_it = False
    with pytest.raises(StoreError, match="two quick profiles in a row were refused"):
        validate_suite(opts, store, backends=fakes.backends())
    assert fakes.profiled == ["p1", "p1-again"] and fakes.cases == []
    man = json.loads((tmp / "out" / "manifest.json").read_text())
    assert man["profile"]["name"] == "p1-again" and len(man["profile"]["unusable"]) == 2
    # resuming does not take a refused profile: it measures again, and the second one is used
    fakes.profiled.clear()
    fakes.store_it, fakes.refuse_first = True, True
    res = validate_suite(replace(opts, resume=True), store, backends=fakes.backends())
    assert fakes.profiled == ["p1", "p1-again"] and len(fakes.cases) == 3
    man = json.loads((tmp / "out" / "manifest.json").read_text())
    assert (
        man["profile"]["name"] == "p1-again"
        and "no profile named 'p1'" in (man["profile"]["refused_before"][0])
    )
    assert res.profile["name"] == "p1-again"


def test_bad_options_and_suites(setup: tuple[Path, ProfileStore, Fakes, SuiteOptions]) -> None:
    tmp, store, fakes, opts = setup
    with pytest.raises(UsageError, match="--sets"):
        SuiteOptions("o", sets=("training",))
    with pytest.raises(UsageError, match="--speed"):
        SuiteOptions("o", speed="later")
    with pytest.raises(UsageError, match="not both"):
        SuiteOptions("o", name="a", profile="b")
    (tmp / "bad.yaml").write_text("calibration: []\nholdout: []\n")
    with pytest.raises(UsageError, match="calibration: expected a non-empty list"):
        validate_suite(SuiteOptions("o", str(tmp / "bad.yaml")), store, backends=fakes.backends())
