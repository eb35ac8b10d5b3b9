"""Running a suite's cases into an output directory, predicting them again, and fitting the
transfer on the calibration set (the result itself: :mod:`meshtax.validate.suite_result`).

The directory is the run's record and its resume point::

    manifest.json              the suite, the options, the machine; then the profile once it
                               is measured (or chosen)
    cases/<set>/<case>.json    one per case, written as soon as the case is done
    traces/<case>.json         the no-mesh traces each case was predicted from
    summary.json, summary.md   at the end (and again after every resume)

Every file is written whole (a temporary file, then renamed), so a killed run keeps exactly the
cases it finished; resuming skips them (failed cases run again).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.model.transfer import (
    KeyTransfer,
    Transfer,
    TransferSample,
    fit_transfer,
    loto_errors,
)
from meshtax.model.transfer import key as model_key
from meshtax.testbed.pinning import pinning_of
from meshtax.validate.prediction import predict_traces
from meshtax.validate.result import (
    CaseResult,
)
from meshtax.validate.suite import SETS, SuiteCase
from meshtax.validate.suite_result import FORMAT, TARGETS, SuiteResult

__all__ = [
    "FORMAT",
    "TARGETS",
    "CaseRunner",
    "Calibrated",
    "SuiteDir",
    "SuiteResult",
    "calibrate",
    "model_keys",
    "profile_record",
    "repredict",
    "run_cases",
    "utc_now",
]


#: measures one case (the real one deploys pods: :func:`meshtax.validate.run.run_case`)
CaseRunner = Callable[[SuiteCase], CaseResult]
Say = Callable[[str], None]


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` whole or not at all (a killed run never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    os.replace(tmp, path)


class SuiteDir:
    """The output directory of one suite run (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.traces = self.root / "traces"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def manifest(self) -> dict[str, Any] | None:
        """The manifest of a run begun here, or None."""
        if not self.manifest_path.is_file():
            return None
        doc: dict[str, Any] = json.loads(self.manifest_path.read_text())
        return doc

    def update_manifest(self, **parts: Any) -> dict[str, Any]:
        doc = {**(self.manifest() or {"format": FORMAT}), **parts}
        _write_json(self.manifest_path, doc)
        return doc

    def case_path(self, case: SuiteCase) -> Path:
        return self.root / "cases" / case.set / f"{case.stem}.json"

    def done(self, case: SuiteCase) -> bool:
        """Measured before, without an error (a failed case runs again on resume)."""
        p = self.case_path(case)
        return p.is_file() and "error_message" not in json.loads(p.read_text())["case"]

    def write_case(self, case: SuiteCase, result: CaseResult, **record: Any) -> Path:
        p = self.case_path(case)
        _write_json(p, {"set": case.set, "key": case.key, **record, "case": result.to_case()})
        return p

    def cases(self) -> dict[str, list[tuple[dict[str, Any], CaseResult]]]:
        """Every case document here, per set (file order within a set is by name)."""
        out: dict[str, list[tuple[dict[str, Any], CaseResult]]] = {s: [] for s in SETS}
        for s in SETS:
            for p in sorted((self.root / "cases" / s).glob("*.json")):
                doc = json.loads(p.read_text())
                out[s].append((doc, CaseResult.from_case(doc["case"])))
        return out

    def result(self) -> SuiteResult:
        """The suite's result from what is here: every case measured so far, in the suite's
        order, and the cases of the suite that are not (yet) here."""
        man = self.manifest()
        if man is None:
            raise FileNotFoundError(f"{self.root}: no manifest.json (not a suite run)")
        found = {doc["key"]: (doc, c) for docs in self.cases().values() for doc, c in docs}
        order = [str(k) for k in man.get("cases", [])]
        keys = [k for k in order if k in found] + sorted(set(found) - set(order))
        sets = {s: tuple(found[k][1] for k in keys if found[k][0]["set"] == s) for s in SETS}
        loads = [found[k][0].get("loadavg_after") for k in keys]
        return SuiteResult(
            suite=man.get("suite", {}),
            sets=sets,
            profile=man.get("profile", {}),
            machine=man.get("machine", {}),
            options=man.get("options", {}),
            started=str(man.get("started", "")),
            finished=max((str(found[k][0].get("finished", "")) for k in keys), default=""),
            missing=tuple(k for k in order if k not in found),
            loadavg_end=next((x for x in reversed(loads) if x), None),
            case_loads=tuple(float(x[0]) for x in loads if x),
        )

    def write_summary(self, result: SuiteResult) -> tuple[Path, Path]:
        j, m = self.root / "summary.json", self.root / "summary.md"
        _write_json(j, result.to_document())
        m.write_text(result.markdown() + "\n")
        return j, m


def run_cases(
    cases: Sequence[SuiteCase],
    out: SuiteDir,
    run: CaseRunner,
    say: Say | None = None,
    *,
    resume: bool = False,
    record: Mapping[str, Any] | None = None,
) -> list[CaseResult]:
    """Measure ``cases`` in order, each written to ``out`` as soon as it is done (with
    ``record``, the load average around it and its times); with ``resume``, a case already
    measured there is read back instead. Ctrl-C stops after the testbed of the running case
    is gone; what was written stays."""
    tell = say or (lambda _m: None)
    results: list[CaseResult] = []
    for i, c in enumerate(cases, 1):
        head = f"[{i}/{len(cases)}] {c.set} {c.key}"
        if resume and out.done(c):
            doc = json.loads(out.case_path(c).read_text())
            results.append(CaseResult.from_case(doc["case"]))
            tell(f"{head}: measured before, kept")
            continue
        tell(f"{head}: {c.rate:g} requests/s")
        started, before = utc_now(), os.getloadavg()
        res = run(c)
        out.write_case(
            c,
            res,
            **(record or {}),
            started=started,
            finished=utc_now(),
            loadavg_before=before,
            loadavg_after=os.getloadavg(),
        )
        results.append(res)
        tell(f"{head}: {_outcome(res)}")
    return results


def repredict(
    out: SuiteDir, profile: Profile, *, speed: bool = True, only: Sequence[str] | None = None
) -> SuiteResult:
    """The measured cases of ``out`` predicted again from their kept traces with ``profile``
    and this checkout's model (nothing is measured or written): to compare models or profiles
    on the same measurements. A case that recorded the machine's speed when it was measured
    is predicted at that speed (``profile`` scaled from its own; ``speed=False``: at the
    profile's own). A case without its traces keeps an error saying so. ``only``: the sets
    to predict (the others are left out of the result)."""
    res = out.result()
    pod_cpus = pinning_of(profile).pod_cpus()
    sets: dict[str, tuple[CaseResult, ...]] = {}
    for s, cases in res.sets.items():
        if only is not None and s not in only:
            continue
        new = []
        for c in cases:
            trace = out.traces / f"{c.topology}-{c.query}-{c.mode}.json"
            if c.error is not None or not trace.is_file():
                new.append(replace(c, predicted=None, error=c.error or f"no traces at {trace}"))
                continue
            sidecars = {n: SidecarConfig(Mode(m)) for n, m in c.sidecar_modes.items()}
            pred = predict_traces(
                trace,
                profile,
                sidecars,
                c.rate,
                pod_cpus=pod_cpus,
                speed=c.speed if speed else None,
            )
            new.append(replace(c, predicted=pred))
        sets[s] = tuple(new)
    how = (
        "predicted again with this checkout's model, "
        + ("at each case's machine speed" if speed else "at the profile's own speed")
        + f"; measured with {res.profile.get('name')!r}"
    )
    opts = {**res.options, "speed": "now" if speed else "profile"}
    return replace(res, sets=sets, profile=profile_record(profile, how), options=opts)


def model_keys(profile: Profile, *, per_model: bool = True) -> list[str]:
    """Every cost model of ``profile`` a transfer factor can apply to (:func:`model_key`);
    without ``per_model`` only the modes (a tcp mode's factor then covers what it carries)."""
    keys = []
    for m, mp in profile.modes.items():
        keys.append(model_key(m))
        if per_model:
            keys += [model_key(m, p) for p in mp.carried if m is Mode.TCP]
    return keys


def _with_factors(profile: Profile, factors: Mapping[str, float]) -> Profile:
    t = {k: KeyTransfer(f, f, f, 0, 0.0) for k, f in factors.items()}
    return replace(profile, transfer=Transfer(t, "probe"))


def transfer_samples(
    base: SuiteResult,
    probes: Mapping[str, SuiteResult],
    set_name: str = "calibration",
    metric: str = "cpu",
) -> list[TransferSample]:
    """``set_name``'s measured cases as transfer samples of ``metric`` (``cpu``, or ``latency``:
    the p50 overhead): ``base`` predicted them with every factor 1, ``probes[k]`` with model
    ``k``'s factor 2 and the others 1. The CPU prediction is linear in each factor, so a probe's
    excess is model ``k``'s part; what no probe moves (the idle sidecars') is fixed. Latency is
    linear in them too where the shared-CPU bound or one model's crossings set it (a probe's
    excess is then that model's part), and near it elsewhere."""
    out = []
    for i, c in enumerate(base.sets.get(set_name, ())):
        k1 = c.comparisons
        if not k1:
            continue
        p1 = k1[metric].predicted
        parts = {}
        for k, res in probes.items():
            cmp = res.sets[set_name][i].comparisons
            if cmp and (d := cmp[metric].predicted - p1) > 1e-9 * max(p1, 1.0):
                parts[k] = d
        out.append(
            TransferSample(c.topology, k1[metric].measured.median, parts, p1 - sum(parts.values()))
        )
    return out


@dataclass(frozen=True)
class Calibrated:
    """A suite's cases predicted again with the transfer fitted on its calibration set: the
    profile with the transfer, the result, and the leave-one-topology-out CPU errors over the
    calibration set."""

    profile: Profile
    result: SuiteResult
    loto: tuple[float, ...]


def calibrate(
    out: SuiteDir,
    profile: Profile,
    *,
    speed: bool = False,
    per_model: bool = True,
    latency: bool = True,
) -> Calibrated:
    """Fit ``profile``'s transfer (:mod:`meshtax.model.transfer`) on the calibration set of
    ``out`` — only those cases — and predict every case again with it (nothing is measured
    or written). ``speed``: predict each case at the machine speed recorded for it;
    ``per_model``: a factor per cost model (else per mode); ``latency``: latency factors of
    its own, fitted on the cases' latency p50 overheads (suite run 10; else latency takes the
    CPU's, as runs 1–9)."""
    keys = model_keys(profile, per_model=per_model)
    one = dict.fromkeys(keys, 1.0)
    cal = ("calibration",)  # the probes need the calibration cases only
    at1 = repredict(out, _with_factors(profile, one), speed=speed, only=cal)
    probes = {
        k: repredict(out, _with_factors(profile, {**one, k: 2.0}), speed=speed, only=cal)
        for k in keys
    }
    samples = transfer_samples(at1, probes)
    src = (
        f"the calibration set of suite {at1.suite.get('name', '?')!r} "
        f"({len(samples)} cases, {at1.started} → {at1.finished})"
    )
    t = fit_transfer(
        samples, src, transfer_samples(at1, probes, metric="latency") if latency else None
    )
    prof = replace(profile, transfer=t)
    res = repredict(out, prof, speed=speed)
    loto = tuple(loto_errors(samples))
    how = f"{res.profile.get('how')}; {t.describe()}"
    rec = {**profile_record(prof, how), "transfer": t.to_dict()}
    if loto:
        rec["loto"] = {
            "cases": len(loto),
            "median_abs_error": statistics.median(abs(x) for x in loto),
            "bias": statistics.fmean(loto),
        }
    return Calibrated(prof, replace(res, profile=rec), loto)


def profile_record(prof: Profile, how: str, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """What a suite's result says about its profile: name, how it came about, when, its closure
    per mode, its quality (status, interference, speed), the warnings it was measured with and
    its provenance notes."""
    return {
        "name": prof.name,
        "how": how,
        "created": prof.provenance.created,
        "quality": prof.quality(),
        "closure": {
            m.value: {
                **mp.closure.to_dict(),
                "error": mp.closure.error,
                "closes": mp.closure.closes,
            }
            for m, mp in prof.modes.items()
            if mp.closure is not None
        },
        "warnings": list(warnings),
        "notes": list(prof.provenance.notes),
    }


def _outcome(c: CaseResult) -> str:
    if c.error is not None:
        return f"FAILED ({c.error})"
    k = c.comparisons
    short = f"; SATURATED: the meshed copy ran at {c.mesh_rate_share:.0%} of the rate"
    return (
        f"latency {k['latency'].measured.median:.0f} µs measured, {k['latency'].predicted:.0f} "
        f"predicted ({k['latency'].error:+.0%}); CPU {k['cpu'].measured.median:.0f} vs "
        f"{k['cpu'].predicted:.0f} µs/request ({k['cpu'].error:+.0%}); {c.wall_s:.0f} s"
        + (short if c.saturated else "")
    )
