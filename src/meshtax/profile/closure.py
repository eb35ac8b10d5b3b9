"""A mode whose components do not close is measured again (``Plan.closure_retries``): the
attempt closer to closing is kept, the other recorded in the profile's ``attempts``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.profile.build import SizeResult, points
from meshtax.profile.fit import fit_mode
from meshtax.profile.plan import Plan

__all__ = ["closure_error", "retry_unclosed"]


def retry_unclosed(
    plan: Plan,
    results: dict[Mode, list[SizeResult]],
    attempts: dict[Mode, list[dict[str, Any]]],
    measure: Callable[[Mode], list[SizeResult]],
) -> bool:
    """Measure each mode that does not close once more and keep the attempt closer to
    closing (the other in ``attempts``); whether any mode was measured again."""
    tol = plan.closure_tolerance
    open_modes = [m for m in plan.modes if abs(closure_error(m, plan, results)) > tol]
    for mode in open_modes:
        before = closure_error(mode, plan, results)
        again = measure(mode)
        after = closure_error(mode, plan, {**results, mode: again})
        better = abs(after) < abs(before)
        kept, dropped = (again, results[mode]) if better else (results[mode], again)
        attempts.setdefault(mode, []).append(
            {
                "closure_error": before if better else after,
                "measurements": [r.to_dict() for r in dropped],
            }
        )
        results[mode] = kept
    return bool(open_modes)


def closure_error(mode: Mode, plan: Plan, results: Mapping[Mode, list[SizeResult]]) -> float:
    """The closure error the mode's measurements would fit to (components vs overhead)."""
    tcp = {r.size: r for r in results.get(Mode.TCP, [])}
    c = fit_mode(
        mode, points(mode, results[mode], tcp, []), tolerance=plan.closure_tolerance
    ).closure
    return 0.0 if c is None else c.error
