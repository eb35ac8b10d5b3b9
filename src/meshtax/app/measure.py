"""Entry points that measure this machine (root): profile (with extras), validate (one
topology or the suite), the one-hop sweeps, and the readiness checks. Options in, profiles
and documents out."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from meshtax.app import doctor
from meshtax.app.pricing import role_profiles
from meshtax.errors import StoreError, UsageError
from meshtax.model.profile import Profile
from meshtax.model.proxy import ProxyChoice
from meshtax.model.sidecar import Architecture, Mode
from meshtax.profile.backends import Backends
from meshtax.profile.build import ClosureWarning
from meshtax.profile.extras import ExtrasOptions, profile_extras
from meshtax.profile.run import ProfileOptions, Progress, run_profile
from meshtax.store.resolve import Resolved, quality_lines, resolve_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host
from meshtax.testbed.paired import PairPolicy
from meshtax.testbed.pinning import pinning_of
from meshtax.testbed.pods import Testbed
from meshtax.testbed.runstate import RunBusy, owned_tempdir
from meshtax.testbed.system import RealSystem, System
from meshtax.validate.result import CaseResult, ValidationResult
from meshtax.validate.run import ValidateOptions, machine, run_case, run_validation
from meshtax.validate.suite import ORDERS, SETS, Suite, SuiteCase, SuiteError, load_suite
from meshtax.validate.suite_run import (
    CaseRunner,
    SuiteDir,
    SuiteResult,
    calibrate,
    profile_record,
    run_cases,
    utc_now,
)
from meshtax.validate.sweep import SweepResult, run_sweep

__all__ = [
    "ExtrasOptions",
    "MeasureOptions",
    "Measured",
    "ProfileOptions",
    "ProxyChoice",
    "SuiteBackends",
    "SuiteOptions",
    "SweepOptions",
    "ValidateOptions",
    "check_machine",
    "measure",
    "real_suite_backends",
    "require_root",
    "sweep",
    "validate",
    "validate_suite",
]

Say = Callable[[str], None]


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UsageError(f"{what}: run it as root (see `meshtax doctor`)")


@dataclass(frozen=True)
class MeasureOptions:
    """``meshtax profile``: the base profile (``profile``) and what to add to it (``extras``;
    None: nothing). With extras, ``base`` names the profile to extend (default: this
    machine's newest, measured first if there is none)."""

    profile: ProfileOptions
    extras: ExtrasOptions | None = None
    base: str | None = None
    wait_s: float = 0.0


@dataclass(frozen=True)
class Measured:
    profile: Profile
    warnings: tuple[str, ...]


def measure(
    opts: MeasureOptions,
    store: ProfileStore,
    progress: Callable[[Progress], None] | None = None,
    say: Say | None = None,
    *,
    system: System | None = None,
    backends: Backends | None = None,
) -> Measured:
    """Profile this machine's sidecar (unless extending an existing profile), then the
    extras; every profile is stored as soon as it is measured."""
    system = system or RealSystem()
    be = backends or Backends(lock_timeout=opts.wait_s)
    opts.profile.resolve_plan()  # refuse a bad combination before anything starts
    if opts.extras is not None and opts.profile.proxy.kind != "envoy":
        raise UsageError(
            "--filters/--mtls/--memory/--large measure Envoy; profile them without --proxy"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ClosureWarning)
        try:
            if opts.extras is not None and opts.base:
                prof = store.get(opts.base)
            elif opts.extras is not None and (host := store.for_host(this_host())) is not None:
                prof = host
            else:
                prof = run_profile(opts.profile, system, store, progress, backends=be)
            if opts.extras is not None:
                prof = profile_extras(opts.extras, system, store, prof.name, say, backends=be)
        except (RunBusy, ValueError) as e:
            raise UsageError(str(e)) from None
    notes = tuple(str(w.message) for w in caught if issubclass(w.category, ClosureWarning))
    return Measured(prof, notes)


def validate(
    opts: ValidateOptions, store: ProfileStore, say: Say | None = None
) -> ValidationResult:
    """Measured vs predicted on a multi-service app in pods (:mod:`meshtax.validate.run`)."""
    resolved = resolve_profile(
        store, opts.profile_name, this_host(), accept_unclosed=opts.accept_unclosed
    )
    names, said = role_profiles(
        store, (Architecture(opts.architecture),), accept_unclosed=opts.accept_unclosed
    )
    roles = {a: store.get(n) for a, n in names.items()}
    try:
        return run_validation(
            opts,
            RealSystem(),
            resolved.profile,
            say,
            warnings=[*resolved.warnings, *said],
            roles=roles,
        )
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None


@dataclass(frozen=True)
class SuiteOptions:
    """``meshtax validate --suite``: run ``suite`` (a file; None: the bundled one) into the
    directory ``out``. ``sets``: which sets to measure. ``rate``/``duration_s``: override the
    suite's. ``name``: the new profile's name (None: generated); ``profile``: use this stored
    profile instead of measuring one (the report says so). ``accept_unclosed``: go on with a
    profile that does not close. ``speed``: as ``validate --speed``. ``resume``: continue the
    run in ``out``, skipping what it measured."""

    out: str
    suite: str | None = None
    sets: tuple[str, ...] = SETS
    rate: float | None = None
    duration_s: float | None = None
    quick: bool = False
    name: str | None = None
    profile: str | None = None
    accept_unclosed: bool = False
    # each case at the machine speed read beside it (suite run 9); "profile": as measured
    speed: str = "now"
    resume: bool = False
    wait_s: float = 0.0
    #: "interleaved" (since suite run 12) or "sets" (see :data:`meshtax.validate.suite.ORDERS`)
    order: str = "interleaved"

    def __post_init__(self) -> None:
        if not self.sets or any(s not in SETS for s in self.sets):
            raise UsageError(f"--sets: {','.join(self.sets)!r}; expected some of {','.join(SETS)}")
        if self.order not in ORDERS:
            raise UsageError(f"--order: {self.order!r}; expected one of {', '.join(ORDERS)}")
        if (self.rate is not None and self.rate < 0) or (
            self.duration_s is not None and self.duration_s <= 0
        ):
            raise UsageError("--rate must be ≥ 0 (0: closed loop) and --duration positive")
        if self.name and self.profile:
            raise UsageError("--name names a new profile, --profile an existing one: not both")
        if self.speed not in ("now", "profile"):
            raise UsageError(f"--speed: {self.speed!r}; expected now or profile")


@dataclass(frozen=True)
class SuiteBackends:
    """The side effects of a suite run: measuring a profile (name, say → Measured) and making
    the runner of one case for a profile and the run's output. Tests pass fakes."""

    profile: Callable[[str | None, Say], Measured]
    cases: Callable[[Profile, Suite, SuiteOptions, SuiteDir, Say], CaseRunner]


def real_suite_backends(store: ProfileStore, wait_s: float) -> SuiteBackends:
    """A quick profile of this machine stored in ``store`` (waiting up to ``wait_s`` for the
    profiling lock), and each case deployed for real by :func:`~meshtax.validate.run.run_case`
    (its traces kept in the output directory, its scratch directory removed)."""
    system = RealSystem()

    def profile(name: str | None, say: Say) -> Measured:
        last: list[str] = []

        def progress(p: Progress) -> None:
            if p.description != (last or [""])[-1]:
                last.append(p.description)
                say(f"profile [{p.index}/{p.total}] {p.description}")

        opts = MeasureOptions(ProfileOptions(name=name, quick=True), wait_s=wait_s)
        return measure(opts, store, progress, say, system=system)

    def cases(
        prof: Profile, suite: Suite, opts: SuiteOptions, out: SuiteDir, say: Say
    ) -> CaseRunner:
        pinning = pinning_of(prof)

        def run(c: SuiteCase) -> CaseResult:
            vopts = ValidateOptions(
                c.topology,
                (c.query,),
                (c.mode,),
                rate=c.rate,
                duration_s=opts.duration_s or suite.duration_s,
                profile_name=prof.name,
                accept_unclosed=opts.accept_unclosed,
                quick=opts.quick,
                traces_dir=str(out.traces),
                speed=opts.speed,
            )
            work = owned_tempdir("suite")
            try:
                topo = suite.topologies[c.topology]
                return run_case(topo, c.query, c.mode, prof, vopts, system, work, pinning, say)
            finally:
                shutil.rmtree(work, ignore_errors=True)

        return run

    return SuiteBackends(profile, cases)


def validate_suite(
    opts: SuiteOptions,
    store: ProfileStore,
    say: Say | None = None,
    *,
    backends: SuiteBackends | None = None,
) -> SuiteResult:
    """In one sitting: (a) profile this machine (quick), (b) every case of the calibration and
    hold-out sets, interleaved (``opts.order``); each step and case recorded in ``opts.out`` as it
    is done (see :mod:`meshtax.validate.suite_run`), the summary written at the end, also when
    interrupted. Then the transfer is fitted on the calibration set alone and every case
    predicted again with it (:func:`_calibrated`); the result carries both."""
    tell = say or (lambda _m: None)
    be = backends or real_suite_backends(store, opts.wait_s)
    try:
        suite = load_suite(opts.suite)
    except SuiteError as e:
        raise UsageError(str(e)) from None
    out = SuiteDir(opts.out)
    man = out.manifest()
    if man is not None and not opts.resume:
        raise UsageError(f"{out.root} holds a suite run already: --resume continues it")
    cases = tuple(
        c if opts.rate is None else replace(c, rate=opts.rate)
        for c in suite.in_order(opts.sets, opts.order)
    )
    run_opts = {
        "duration_s": opts.duration_s or suite.duration_s,
        "quick": opts.quick,
        "rates": "/".join(f"{r:g}" for r in dict.fromkeys(c.rate for c in cases)),
        "speed": opts.speed,
        "order": opts.order,
    }
    # runs before the order was recorded measured set after set
    if man is not None and {"order": "sets", **man.get("options", {})} != run_opts:
        was = man.get("options", {})
        raise UsageError(
            f"{out.root} was run with {was}, not {run_opts}: resume with the same options"
        )
    if man is None:
        man = out.update_manifest(
            suite=suite.describe(),
            cases=[c.key for c in cases],
            options=run_opts,
            machine=machine(),
            started=utc_now(),
        )
    else:
        tell(f"resuming the run begun {man.get('started')} in {out.root}")
        man = out.update_manifest(cases=[c.key for c in cases])
    try:
        prof = _suite_profile(opts, store, man, out, be, tell)
        runner = be.cases(prof, suite, opts, out, tell)
        run_cases(cases, out, runner, tell, resume=opts.resume, record={"profile": prof.name})
    finally:
        result = out.result()
        out.write_summary(result)
    return _calibrated(result, out, prof, store, opts, tell)


def _calibrated(
    result: SuiteResult,
    out: SuiteDir,
    prof: Profile,
    store: ProfileStore,
    opts: SuiteOptions,
    say: Say,
) -> SuiteResult:
    """``result`` with its cases predicted again with the transfer fitted on its calibration
    set (:func:`~meshtax.validate.suite_run.calibrate`), the summary written again; the
    profile with the transfer stored as ``<name>+cal`` for ``predict`` and ``validate``.
    Unchanged when the calibration set has no measured case."""
    if not any(c.comparisons for c in result.sets.get("calibration", ())):
        return result
    try:
        cal = calibrate(out, prof, speed=opts.speed == "now")
    except ValueError as e:
        say(f"no transfer fitted: {e}")
        return result
    stored = replace(cal.profile, name=f"{prof.name}+cal")
    store.save(stored, replace=True)
    t = stored.transfer
    say(f"stored profile {stored.name!r}: {t.describe() if t else ''}")
    result = replace(result, calibrated=cal.result)
    out.write_summary(result)
    return result


def _suite_profile(
    opts: SuiteOptions,
    store: ProfileStore,
    man: Mapping[str, Any],
    out: SuiteDir,
    be: SuiteBackends,
    say: Say,
) -> Profile:
    """The run's profile: the interrupted run's, a stored one, or a quick one measured now
    (once more, as ``<name>-again``, when the store refuses the first on load); refused (after
    it is recorded) when it does not close, unless ``accept_unclosed``."""
    done = man.get("profile")
    if opts.resume and done and "unusable" not in done:
        say(f"profile {done['name']!r} of the interrupted run")
        res = resolve_profile(store, str(done["name"]), this_host(), accept_unclosed=True)
    elif opts.profile:
        res = resolve_profile(store, opts.profile, this_host(), accept_unclosed=True)
        rec = profile_record(res.profile, "stored earlier, not this sitting", res.warnings)
        out.update_manifest(profile=rec)
    else:
        res = _measure_suite_profile(opts, store, out, be, say)
    if res.profile.unclosed and not opts.accept_unclosed:
        raise UsageError(
            "; ".join(quality_lines(res.profile) or [f"profile {res.profile.name!r} is unclosed"])
            + ". Not validating with it: profile again on a quieter machine (a new output "
            "directory), or pass --resume --accept-unclosed to go on with it anyway"
        )
    return res.profile


def _measure_suite_profile(
    opts: SuiteOptions, store: ProfileStore, out: SuiteDir, be: SuiteBackends, say: Say
) -> Resolved:
    how = "measured in this sitting, quick"
    refused: list[str] = []
    for name in (opts.name, None if opts.name is None else f"{opts.name}-again"):
        say("profiling this machine (quick)" + (" once more" if refused else ""))
        measured = be.profile(name, say)
        try:
            res = resolve_profile(store, measured.profile.name, this_host(), accept_unclosed=True)
        except StoreError as e:  # stored, but refused on load (e.g. a total negative at 1 GiB)
            refused.append(str(e))
            out.update_manifest(
                profile={"name": measured.profile.name, "how": how, "unusable": refused}
            )
            say(f"the store refuses the profile just measured: {e}")
            continue
        rec = profile_record(res.profile, how, (*measured.warnings, *res.warnings))
        out.update_manifest(profile={**rec, **({"refused_before": refused} if refused else {})})
        return res
    raise StoreError(f"two quick profiles in a row were refused by the store: {refused[-1]}")


@dataclass(frozen=True)
class SweepOptions:
    kind: Literal["size", "rate"]
    mode: Mode = Mode.HTTP
    duration_s: float = 2.0
    profile: str | None = None
    sizes: Sequence[int] = field(default=(100, 1024, 4096, 16384, 65536))
    rate: float = 200.0  # the size sweep's rate
    pairs: tuple[int, int] = (6, 8)  # paired runs per point: at least, at most
    accept_unclosed: bool = False


def sweep(opts: SweepOptions, store: ProfileStore, say: Say | None = None) -> SweepResult:
    """One hop, size or rate sweep, measured vs predicted."""
    prof = resolve_profile(
        store, opts.profile, this_host(), accept_unclosed=opts.accept_unclosed
    ).profile
    with Testbed(RealSystem(), lock_timeout=900.0) as tb:
        return run_sweep(
            opts.kind,
            tb,
            prof,
            pinning_of(prof),
            machine(),
            mode=opts.mode,
            sizes=opts.sizes,
            rate=opts.rate,
            duration_s=opts.duration_s,
            policy=PairPolicy(*opts.pairs),
            progress=say,
        )


def check_machine(prepare: bool) -> tuple[list[str], list[doctor.Check]]:
    """What profiling needs here (and, with ``prepare``, what was fixed first)."""
    system = RealSystem()
    changed = doctor.prepare(system) if prepare else []
    return changed, doctor.check_all(system)
