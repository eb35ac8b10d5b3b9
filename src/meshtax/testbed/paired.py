"""The one paired-run loop: every with/without comparison meshtax makes (sidecar vs direct,
filter vs base, mTLS vs plaintext, mesh vs no mesh) runs through :func:`paired_runs`.

A *group* is a tuple of run names compared with each other, the first being the reference
(``("direct", "meshed")``, ``("base", "lua")``, or a block ``("base", "fault", "tap",
"fault+tap")``). A *round* runs every group once; the list of groups rotates by one each
round, so no group always runs first. Inside a group the order alternates with the round
(``alternate``: as given, then reversed) so a drifting machine lands on both sides of a
difference equally, or (``palindrome``) rotates and then mirrors (``a b c c b a``), so each
name's mean run time is the group's centre and a drift linear in time over the group cancels
exactly.

Repetition stops after ``max_rounds`` rounds; earlier when ``narrow`` (the caller's test on
the results so far, from ``min_rounds`` on) says the intervals are tight; or before a group
that would overrun ``budget_s`` (judged by the longest group so far). A group ``accept``
refuses (its windows were contaminated by other work, say) is run again, up to
``max_rejects`` times in all; after that the loop stops (``contaminated``) with what it has.
Pure: runs are injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from meshtax.model.stats import Estimate, estimate

__all__ = [
    "GroupRun",
    "Paired",
    "PairPolicy",
    "group_order",
    "is_narrow",
    "paired_runs",
]

T = TypeVar("T")
Order = Literal["alternate", "palindrome"]


@dataclass(frozen=True)
class PairPolicy:
    """At least ``min_rounds``, at most ``max_rounds`` rounds, within ``budget_s`` seconds."""

    min_rounds: int = 1
    max_rounds: int = 1
    budget_s: float | None = None
    order: Order = "alternate"

    def __post_init__(self) -> None:
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ValueError("need 1 <= min_rounds <= max_rounds")

    @classmethod
    def fixed(cls, rounds: int, order: Order = "alternate") -> PairPolicy:
        return cls(rounds, rounds, None, order)


@dataclass(frozen=True)
class GroupRun(Generic[T]):
    """One group of one round: every name's runs in run order (one each, two in a
    palindrome), and the wall-clock times (Unix seconds) it started and ended."""

    round: int
    group: tuple[str, ...]
    runs: Mapping[str, tuple[T, ...]]
    t_start: float = 0.0
    t_end: float = 0.0

    def first(self, name: str) -> T:
        return self.runs[name][0]


@dataclass(frozen=True)
class Paired(Generic[T]):
    """Everything a loop kept, why it stopped (``narrow``, ``max_rounds``, ``budget``,
    ``contaminated``), and the groups it ran but refused."""

    groups: tuple[GroupRun[T], ...]
    stop: str
    rejected: tuple[GroupRun[T], ...] = ()

    @property
    def rounds(self) -> int:
        return len({g.round for g in self.groups})

    def pairs(self, a: str, b: str) -> list[tuple[T, T]]:
        """``(a, b)`` of every group run holding both, in time order (first runs)."""
        return [(g.first(a), g.first(b)) for g in self.groups if a in g.runs and b in g.runs]

    def runs_of(self, name: str) -> list[T]:
        """Every run of ``name``, in time order."""
        return [x for g in self.groups for x in g.runs.get(name, ())]


def group_order(names: Sequence[str], r: int, order: Order = "alternate") -> list[str]:
    """The run order of a group in round ``r``: ``alternate`` → ``names`` (even rounds) or
    reversed (odd); ``palindrome`` → rotated by ``r``, then mirrored
    (``[a, b, c]``, r=1 → ``b c a a c b``)."""
    if not names:
        return []
    if order == "alternate":
        return list(names) if r % 2 == 0 else list(reversed(names))
    k = r % len(names)
    rot = [*names[k:], *names[:k]]
    return [*rot, *reversed(rot)]


def is_narrow(samples: Sequence[float], rel_halfwidth: float, confidence: float = 0.95) -> bool:
    """Is the median's interval of ``samples`` within ``rel_halfwidth`` of the median (at the
    confidence the order statistics reach)?"""
    if not samples:
        return False
    e: Estimate = estimate(samples, confidence)
    return e.coverage >= confidence and e.rel_halfwidth <= rel_halfwidth


def paired_runs(
    groups: Sequence[Sequence[str]],
    run: Callable[[str], T],
    policy: PairPolicy,
    *,
    narrow: Callable[[Paired[T]], bool] | None = None,
    accept: Callable[[GroupRun[T]], bool] | None = None,
    max_rejects: int = 0,
    first_round: int = 0,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    progress: Callable[[str], None] | None = None,
) -> Paired[T]:
    """Run ``groups`` in rounds (see the module docstring); ``run(name)`` makes one run.
    Rounds are numbered from ``first_round`` (a later chunk continues the rotation)."""
    if not groups or any(len(g) < 1 for g in groups):
        raise ValueError("need at least one non-empty group")
    done: list[GroupRun[T]] = []
    rejected: list[GroupRun[T]] = []
    t0 = clock()
    longest = 0.0

    def result(stop: str) -> Paired[T]:
        return Paired(tuple(done), stop, tuple(rejected))

    for i in range(policy.max_rounds):
        r = first_round + i
        k = r % len(groups)
        for g in [*groups[k:], *groups[:k]]:
            while True:
                now = clock()
                ran = bool(done or rejected)
                if policy.budget_s is not None and ran and (now - t0) + longest > policy.budget_s:
                    return result("budget")
                ts = wall()
                got: dict[str, list[T]] = {}
                for name in group_order(g, r, policy.order):
                    got.setdefault(name, []).append(run(name))
                one = GroupRun(r, tuple(g), {n: tuple(v) for n, v in got.items()}, ts, wall())
                longest = max(longest, clock() - now)
                if accept is None or accept(one):
                    done.append(one)
                    break
                rejected.append(one)
                if len(rejected) > max_rejects:
                    return result("contaminated")
        if progress is not None:
            progress(f"round {i + 1}/{policy.max_rounds}, {clock() - t0:.0f} s")
        if i + 1 >= policy.min_rounds and narrow is not None and narrow(result("")):
            return result("narrow")
    return result("max_rounds")
