"""Entry points that measure this machine (root): profile (with extras), validate,
the one-hop sweeps, and the readiness checks. Options in, profiles and documents out."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from meshtax.app import doctor
from meshtax.errors import UsageError
from meshtax.model.profile import Profile
from meshtax.model.proxy import ProxyChoice
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.build import ClosureWarning
from meshtax.profile.extras import ExtrasOptions, profile_extras
from meshtax.profile.run import ProfileOptions, Progress, run_profile
from meshtax.store.resolve import resolve_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host
from meshtax.testbed.paired import PairPolicy
from meshtax.testbed.pinning import pinning_of
from meshtax.testbed.pods import Testbed
from meshtax.testbed.runstate import RunBusy
from meshtax.testbed.system import RealSystem, System
from meshtax.validate.result import ValidationResult
from meshtax.validate.run import ValidateOptions, machine, run_validation
from meshtax.validate.sweep import SweepResult, run_sweep

__all__ = [
    "ExtrasOptions",
    "MeasureOptions",
    "Measured",
    "ProfileOptions",
    "ProxyChoice",
    "SweepOptions",
    "ValidateOptions",
    "check_machine",
    "measure",
    "require_root",
    "sweep",
    "validate",
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
    try:
        return run_validation(opts, RealSystem(), resolved.profile, say, warnings=resolved.warnings)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None


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
