"""Are filter costs additive? A chain's cost against base + the sum of its members'.

Two designs, both through the one paired-run loop:

* rounds (:func:`additivity`): the filter profile's own rounds, each variant paired with its
  own base run (:mod:`meshtax.profile.filters`);
* paired blocks (:func:`profile_blocks`): on this shared machine a base run's CPU per request
  moves by 2× within seconds, and in a round a combination and its members are measured up to
  minutes apart. A *block* runs, for one combination, base, every member and the chain back to
  back (seconds in all), as a palindrome (every variant twice, the second pass mirrored), so
  each variant's mean run time is the block's centre and a drift linear in time cancels. The
  additivity result is the median of the per-block errors with its 95 % interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.backends import Backends
from meshtax.profile.filters import (
    FilterRunOptions,
    ModeRun,
    VariantSamples,
    differences,
    run_length,
)
from meshtax.profile.loopback import variant_envoy
from meshtax.testbed.envoy.variants import BASE, Variant, filter_variants
from meshtax.testbed.paired import PairPolicy, paired_runs
from meshtax.testbed.pods import Testbed

__all__ = [
    "AdditivityRow",
    "Block",
    "BlockRow",
    "additivity",
    "block_additivity",
    "profile_blocks",
    "total_errors_by_round",
]


@dataclass(frozen=True)
class AdditivityRow:
    """A combination: the sum of its members' measured costs against its own measured cost.

    Two comparisons, both per request through one sidecar (worker thread CPU):

    * **total** (the paper's Fig. 9, Sahu et al.): predicted = base + Σ single-filter
      increments, against the measured CPU of the sidecar with the chain
      (:attr:`total_error`); per round too, with each run's adjacent base
      (:attr:`total_error_rounds`, a median with its 95 % interval);
    * **increment**: Σ single-filter increments against the chain's increment over base
      (:attr:`increment_error`); dominated by noise when the filters are small.
    """

    name: str
    mode: Mode
    size: int
    members: tuple[str, ...]
    predicted_cpu_us: float  # Σ member increments (medians of paired differences)
    measured_cpu_us: Estimate  # the chain's increment over base, paired
    predicted_instructions: float | None
    measured_instructions: float | None
    base_cpu_us: float = 0.0  # median of every base run at this size
    measured_total_cpu_us: Estimate | None = None  # the chain's own runs
    total_error_rounds: Estimate | None = None
    base_instructions: float | None = None

    @property
    def cpu_error(self) -> float:
        """Error on the increment (kept under its first name)."""
        m = self.measured_cpu_us.median
        return (self.predicted_cpu_us - m) / m if m else float("inf")

    @property
    def increment_error(self) -> float:
        return self.cpu_error

    @property
    def predicted_total_cpu_us(self) -> float:
        return self.base_cpu_us + self.predicted_cpu_us

    @property
    def total_error(self) -> float | None:
        if self.measured_total_cpu_us is None or not self.measured_total_cpu_us.median:
            return None
        return self.predicted_total_cpu_us / self.measured_total_cpu_us.median - 1

    @property
    def instructions_error(self) -> float | None:
        if self.predicted_instructions is None or not self.measured_instructions:
            return None
        return (
            self.predicted_instructions - self.measured_instructions
        ) / self.measured_instructions

    @property
    def total_instructions_error(self) -> float | None:
        """As :attr:`instructions_error`, on base + Σ increments vs the chain's total."""
        if (
            self.predicted_instructions is None
            or self.measured_instructions is None
            or not self.base_instructions
        ):
            return None
        return (self.base_instructions + self.predicted_instructions) / (
            self.base_instructions + self.measured_instructions
        ) - 1

    def to_dict(self) -> dict[str, Any]:
        t, tr = self.measured_total_cpu_us, self.total_error_rounds
        return {
            "name": self.name,
            "mode": self.mode.value,
            "size": self.size,
            "members": list(self.members),
            "base_cpu_us": self.base_cpu_us,
            "predicted_total_cpu_us": self.predicted_total_cpu_us,
            "measured_total_cpu_us": None if t is None else t.to_dict(),
            "total_error": self.total_error,
            "total_error_rounds": None if tr is None else tr.to_dict(),
            "predicted_cpu_us": self.predicted_cpu_us,
            "measured_cpu_us": self.measured_cpu_us.to_dict(),
            "cpu_error": self.cpu_error,
            "increment_error": self.increment_error,
            "predicted_instructions": self.predicted_instructions,
            "measured_instructions": self.measured_instructions,
            "instructions_error": self.instructions_error,
            "base_instructions": self.base_instructions,
            "total_instructions_error": self.total_instructions_error,
        }


def total_errors_by_round(
    by: Mapping[str, VariantSamples], name: str, members: Sequence[str]
) -> list[float]:
    """Per round r: (base_r + Σ Δ_i,r) / chain_r − 1, where base_r is the base run adjacent to
    the chain's run and Δ_i,r each member's paired difference in the same round."""
    c = by[name]
    rounds = min([len(c.cpu_us)] + [len(by[m].cpu_us) for m in members])
    out = []
    for r in range(rounds):
        pred = c.base_cpu_us[r] + sum(by[m].cpu_us[r] - by[m].base_cpu_us[r] for m in members)
        if c.cpu_us[r]:
            out.append(pred / c.cpu_us[r] - 1)
    return out


def additivity(run: ModeRun, combos: Mapping[str, Sequence[str]]) -> list[AdditivityRow]:
    """Predicted (base + sum of single-filter differences) vs measured, per combination and size."""
    rows = []
    for size, diffs in differences(run).items():
        by = run.samples[size]
        for name, members in combos.items():
            if name not in diffs or any(m not in diffs for m in members):
                continue
            insts = [diffs[m].instructions for m in members]
            pred_i = (
                None if any(i is None for i in insts) else sum(i for i in insts if i is not None)
            )
            errs = total_errors_by_round(by, name, members)
            rows.append(
                AdditivityRow(
                    name,
                    run.mode,
                    size,
                    tuple(members),
                    sum(diffs[m].cpu_us.median for m in members),
                    diffs[name].cpu_us,
                    pred_i,
                    diffs[name].instructions,
                    base_cpu_us=median(by[BASE].cpu_us),
                    measured_total_cpu_us=estimate(by[name].cpu_us),
                    total_error_rounds=estimate(errs) if errs else None,
                    base_instructions=by[BASE].instructions,
                )
            )
    return rows


@dataclass(frozen=True)
class Block:
    """One paired round of one combination (a palindrome,
    :func:`~meshtax.testbed.paired.group_order`): per variant its runs'
    worker CPU per request (µs) in run order; ``t_start``/``t_end`` in Unix seconds."""

    combo: str
    members: tuple[str, ...]
    round: int
    cpu_us: Mapping[str, tuple[float, ...]]
    t_start: float = 0.0
    t_end: float = 0.0

    def mean(self, name: str) -> float:
        xs = self.cpu_us[name]
        return sum(xs) / len(xs)

    @property
    def base_us(self) -> float:
        return self.mean(BASE)

    @property
    def chain_us(self) -> float:
        return self.mean(self.combo)

    @property
    def predicted_us(self) -> float:
        """Base + Σ (member − base), all from this block."""
        b = self.base_us
        return b + sum(self.mean(m) - b for m in self.members)

    @property
    def error(self) -> float:
        """Predicted total / measured chain − 1."""
        return self.predicted_us / self.chain_us - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "combo": self.combo,
            "members": list(self.members),
            "round": self.round,
            "cpu_us": {k: list(v) for k, v in self.cpu_us.items()},
            "t_start": self.t_start,
            "t_end": self.t_end,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Block:
        return cls(
            str(d["combo"]),
            tuple(d["members"]),
            int(d["round"]),
            {str(k): tuple(float(x) for x in v) for k, v in d["cpu_us"].items()},
            float(d.get("t_start", 0.0)),
            float(d.get("t_end", 0.0)),
        )


def profile_blocks(
    tb: Testbed,
    be: Backends,
    mode: Mode,
    combos: Mapping[str, Sequence[str]],
    opts: FilterRunOptions,
    *,
    budget_s: float | None = None,
    first_round: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[Block]:
    """``opts.rounds`` rounds of one block per combination in one Envoy holding base, every
    member and every chain (first size only), stopping before a block that would overrun
    ``budget_s``. Rounds are numbered from ``first_round`` so chunks continue the rotation;
    ``opts.pin`` puts the client on CPU 0, Envoy and the echo app on CPU 1."""
    comps = list(dict.fromkeys(c for v in combos.values() for c in v))
    size = opts.sizes[0]
    say = progress or (lambda _m: None)

    def build(ports: Sequence[int], echo: tuple[str, int], out: Any) -> list[Variant]:
        return filter_variants(mode, comps, ports, echo, combos=combos, outdir=out)

    n = 1 + len(comps) + len(combos)
    with variant_envoy(tb, be, mode, build, n, label=f"blocks-{mode.value}", pin=opts.pin) as ve:
        warm = ve.warm(size, opts.warmup_n)
        n_of = {v: run_length(opts, warm[BASE], warm[v]) for v in ve.variants}
        paired = paired_runs(
            [(BASE, *combos[c], c) for c in combos],
            lambda name: ve.run(name, size, n_of[name])[0],
            PairPolicy(opts.rounds, opts.rounds, budget_s, "palindrome"),
            first_round=first_round,
            clock=be.clock,
            progress=lambda m: say(f"{mode.value}: {m}"),
        )
    if paired.stop == "budget":
        say(f"{mode.value}: budget of {budget_s:.0f} s reached after {len(paired.groups)} blocks")
    return [
        Block(g.group[-1], g.group[1:-1], g.round, g.runs, g.t_start, g.t_end)
        for g in paired.groups
    ]


@dataclass(frozen=True)
class BlockRow:
    """A combination's additivity over its blocks: per-block base, predicted total, measured
    chain and error (predicted / chain − 1), each a median with its 95 % interval."""

    name: str
    members: tuple[str, ...]
    base_us: Estimate
    predicted_us: Estimate
    chain_us: Estimate
    error: Estimate
    increment_predicted_us: float  # median over blocks of Σ (member − base)
    increment_measured_us: float  # median over blocks of chain − base

    @property
    def blocks(self) -> int:
        return self.error.n

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "members": list(self.members),
            "blocks": self.blocks,
            "base_us": self.base_us.to_dict(),
            "predicted_total_us": self.predicted_us.to_dict(),
            "measured_total_us": self.chain_us.to_dict(),
            "error": self.error.to_dict(),
            "increment_predicted_us": self.increment_predicted_us,
            "increment_measured_us": self.increment_measured_us,
        }


def block_additivity(blocks: Sequence[Block]) -> list[BlockRow]:
    """One :class:`BlockRow` per combination, in first-seen order."""
    by: dict[str, list[Block]] = {}
    for b in blocks:
        by.setdefault(b.combo, []).append(b)
    rows = []
    for name, bs in by.items():
        rows.append(
            BlockRow(
                name,
                bs[0].members,
                estimate([b.base_us for b in bs]),
                estimate([b.predicted_us for b in bs]),
                estimate([b.chain_us for b in bs]),
                estimate([b.error for b in bs]),
                median([b.predicted_us - b.base_us for b in bs]),
                median([b.chain_us - b.base_us for b in bs]),
            )
        )
    return rows
