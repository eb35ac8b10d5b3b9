"""What-if analysis: speedup profiles that scale or replace components of a profile.

A speedup file (YAML)::

    name: faster-ipc-and-parsing
    scale:              # percent change per component; negative is faster
      ipc: -30%
      write: -50%
      parsing: -20%
      filter:lua: -40%  # one filter
      filters: -10%     # every filter
      all: -5%          # every component (applied on top of the specific ones)
    replace:            # take a component's model from another profile
      parsing: {profile: envoy-next, mode: http}   # mode defaults to each mode itself

Scaling multiplies every parameter of the component's latency and CPU models.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from meshtax.errors import PredictError, clip
from meshtax.model.components import Component, Kind
from meshtax.model.costmodel import ComponentModel
from meshtax.model.profile import ModeProfile, Profile
from meshtax.model.schema import problems
from meshtax.model.sidecar import Mode

_PCT = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")
_MODES = [m.value for m in Mode]
#: JSON Schema of a speedup file; numbers are finite (model/schema.py); a percentage is a
#: number or text like ``-30%``, checked for range by :func:`parse_factor`.
SPEEDUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "description": {"type": "string"},
        "scale": {
            "type": "object",
            "additionalProperties": {
                "anyOf": [{"type": "number"}, {"type": "string", "pattern": _PCT.pattern}],
                "x-expected": "a percent change like -30% or +10%",
            },
        },
        "replace": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "x-expected": "{profile: NAME, mode: tcp|http|grpc}",
                "additionalProperties": False,
                "required": ["profile"],
                "properties": {
                    "profile": {"type": "string", "minLength": 1},
                    "mode": {"anyOf": [{"type": "null"}, {"enum": _MODES}]},
                },
            },
        },
    },
}


class SpeedupError(PredictError):
    """A speedup file that cannot be used (names the file, the entry and what was expected)."""


@dataclass(frozen=True)
class Replacement:
    profile: str
    mode: Mode | None = None


@dataclass(frozen=True)
class Speedup:
    """Factors per target (a component key, ``filters`` or ``all``) and replacements."""

    name: str
    factors: Mapping[str, float] = field(default_factory=dict)
    replace: Mapping[Component, Replacement] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{k} {100 * (f - 1):+g}%" for k, f in self.factors.items()]
        parts += [
            f"{c.key} from {r.profile}" + (f" ({r.mode.value})" if r.mode else "")
            for c, r in self.replace.items()
        ]
        return ", ".join(parts) or "no change"


def parse_factor(value: Any, where: str) -> float:
    """``-30%`` → 0.7; a bare number is a percent too (``-30`` → 0.7)."""
    if isinstance(value, bool):
        raise SpeedupError(f"{where}: {value!r}; expected a percent change like -30%")
    if isinstance(value, (int, float)):
        pct = float(value)
    else:
        m = _PCT.match(str(value))
        if not m:
            raise SpeedupError(
                f"{where}: {clip(value)}; expected a percent change like -30% or +10%"
            )
        pct = float(m.group(1))
    if not math.isfinite(pct) or pct > 1e6:
        raise SpeedupError(f"{where}: {clip(value)}; expected a finite percent change")
    if pct < -100:
        raise SpeedupError(f"{where}: {pct:g}% would make a cost negative; expected ≥ -100%")
    return 1.0 + pct / 100.0


def speedup_from_dict(d: Any, source: str = "<speedup>") -> Speedup:
    """A validated speedup (:data:`SPEEDUP_SCHEMA`, then each entry); every problem of the
    schema is raised together."""
    if not isinstance(d, Mapping):
        raise SpeedupError(f"{source}: expected a mapping with 'scale' and/or 'replace'")
    bad = problems(SPEEDUP_SCHEMA, d, limit=10)
    if bad:
        raise SpeedupError(f"{source}: " + "; ".join(bad), file=source)
    factors: dict[str, float] = {}
    for k, v in (d.get("scale") or {}).items():
        key = str(k).strip().lower()
        if key not in ("filters", "all"):
            try:
                key = Component.parse(key).key
            except ValueError as e:
                raise SpeedupError(f"{source}: scale.{k}: {e}") from None
        factors[key] = parse_factor(v, f"{source}: scale.{k}")
    repl: dict[Component, Replacement] = {}
    for k, v in (d.get("replace") or {}).items():
        try:
            comp = Component.parse(str(k))
        except ValueError as e:
            raise SpeedupError(f"{source}: replace.{k}: {e}") from None
        if not isinstance(v, Mapping) or "profile" not in v:
            raise SpeedupError(
                f"{source}: replace.{k}: expected {{profile: NAME, mode: tcp|http|grpc}}"
            )
        try:
            mode = Mode(v["mode"]) if v.get("mode") else None
        except ValueError:
            raise SpeedupError(
                f"{source}: replace.{k}.mode: {v['mode']!r}; expected tcp, http or grpc"
            ) from None
        repl[comp] = Replacement(str(v["profile"]), mode)
    if not factors and not repl:
        raise SpeedupError(f"{source}: no 'scale' or 'replace' entries; nothing to change")
    return Speedup(str(d.get("name", "speedup")), factors, repl)


def apply_speedup(
    profile: Profile, sp: Speedup, lookup: Callable[[str], Profile] | None = None
) -> tuple[Profile, tuple[str, ...]]:
    """The profile after the speedup, and warnings for targets the profile does not have."""
    warnings: list[str] = []
    used: set[str] = set()
    modes = []
    for mode, mp in profile.modes.items():
        comps: dict[Component, ComponentModel] = {}
        for c, m in mp.components.items():
            if c in sp.replace:
                r = sp.replace[c]
                if lookup is None:
                    raise SpeedupError(
                        f"replace.{c.key}: no profile store to look up {r.profile!r}"
                    )
                other = lookup(r.profile).mode(r.mode or mode).components
                if c not in other:
                    raise SpeedupError(
                        f"replace.{c.key}: profile {r.profile!r} has no {c.key} model in {(r.mode or mode).value} mode"
                    )
                m = other[c]
                used.add(c.key)
            f = sp.factors.get(c.key, 1.0)
            if c.key in sp.factors:
                used.add(c.key)
            if c.kind is Kind.FILTER and "filters" in sp.factors:
                f *= sp.factors["filters"]
                used.add("filters")
            if "all" in sp.factors:
                f *= sp.factors["all"]
                used.add("all")
            comps[c] = m if f == 1.0 else m.scaled(f)
        modes.append(ModeProfile(mode, comps, mp.closure))
    for k in list(sp.factors) + [c.key for c in sp.replace]:
        if k not in used:
            warnings.append(
                f"speedup {sp.name!r}: profile {profile.name!r} has no {k} component; that entry changes nothing"
            )
    prov = replace(
        profile.provenance,
        source="derived",
        notes=(*profile.provenance.notes, f"what-if {sp.name}: {sp.describe()}"),
    )
    after = Profile(f"{profile.name}+{sp.name}", profile.platform, prov, {m.mode: m for m in modes})
    return after, tuple(warnings)
