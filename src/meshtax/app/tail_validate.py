"""``meshtax validate --sweep rate`` (one hop) and ``meshtax validate TOPOLOGY --levels …``:
tail latency under load, measured vs predicted (root; :mod:`meshtax.validate.tail_run`)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from meshtax.errors import UsageError
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode
from meshtax.store.resolve import resolve_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host
from meshtax.testbed.paired import PairPolicy
from meshtax.testbed.pinning import Pinning, nice_of, niceness, pinning_of
from meshtax.testbed.pods import Testbed
from meshtax.testbed.runstate import owned_tempdir
from meshtax.testbed.system import RealSystem
from meshtax.validate.appctl import AppError, load_topology
from meshtax.validate.run import machine
from meshtax.validate.tail import TailValidation
from meshtax.validate.tail_run import FRACTIONS, LoadPlan, run_onehop_tail, run_topology_tail

__all__ = ["FRACTIONS", "TailValidateOptions", "nice_of", "validate_tail"]


@dataclass(frozen=True)
class TailValidateOptions:
    """``meshtax validate --sweep rate`` (``topology`` None: one hop) or ``meshtax validate
    TOPOLOGY --levels …``: load levels as shares of the no-mesh maximum (``relative_to``:
    or of the mesh's, to compare every level below saturation)."""

    topology: str | None = None
    query: str | None = None
    mode: Mode = Mode.HTTP
    levels: tuple[float, ...] = FRACTIONS
    connections: int = 32
    duration_s: float = 2.0
    pairs: int = 3
    profile: str | None = None
    accept_unclosed: bool = False
    keep_dir: str | None = None
    relative_to: Literal["no_mesh", "mesh"] = "no_mesh"
    #: the levels measured twice over, each pass ``pairs`` pairs a level after a settling run
    #: (``LoadPlan``): the record says how well each level repeats within the sitting
    passes: int = 2
    settle_s: float = 1.0
    #: one hop's fixed-rate runs keep fortio's access log (``LoadPlan.onehop_log``)
    onehop_log: bool = False

    def plan(self) -> LoadPlan:
        if not self.levels or not all(0 < f <= 1.5 for f in self.levels):
            raise UsageError(
                f"load levels must be shares of the no-mesh maximum in (0, 1.5]: {self.levels}"
            )
        return LoadPlan(
            fractions=self.levels,
            connections=self.connections,
            duration_s=self.duration_s,
            policy=PairPolicy.fixed(self.pairs),
            relative_to=self.relative_to,
            passes=self.passes,
            settle_s=self.settle_s,
            onehop_log=self.onehop_log,
        )


def validate_tail(
    opts: TailValidateOptions, store: ProfileStore, say: Callable[[str], None] | None = None
) -> TailValidation:
    """Measured vs predicted tail latency under load (:mod:`meshtax.validate.tail_run`)."""
    prof = resolve_profile(
        store, opts.profile, this_host(), accept_unclosed=opts.accept_unclosed
    ).profile
    plan = opts.plan()
    pinning = pinning_of(prof)
    with niceness(nice_of(prof)):
        return _validate(opts, prof, plan, pinning, say)


def _validate(
    opts: TailValidateOptions,
    prof: Profile,
    plan: LoadPlan,
    pinning: Pinning,
    say: Callable[[str], None] | None,
) -> TailValidation:
    try:
        if opts.topology is None:
            with Testbed(RealSystem(), lock_timeout=900.0) as tb:
                return run_onehop_tail(
                    tb, prof, pinning, machine(), mode=opts.mode, plan=plan, progress=say
                )
        topo = load_topology(opts.topology)
        work = Path(opts.keep_dir) if opts.keep_dir else owned_tempdir("validate-tail")
        try:
            return run_topology_tail(
                topo,
                opts.query or topo.query().name,
                opts.mode,
                prof,
                RealSystem(),
                pinning,
                machine(),
                work,
                plan=plan,
                progress=say,
            )
        finally:
            if opts.keep_dir is None:
                shutil.rmtree(work, ignore_errors=True)
    except (ValueError, AppError) as e:
        raise UsageError(str(e)) from None
