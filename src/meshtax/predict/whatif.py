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
      write: {latency: -40%, cpu: -20%}   # latency and CPU separately
    modes:              # per protocol mode: these entries take the place of `scale` there
      tcp: {ipc: {latency: -62%, cpu: -35%}}
    replace:            # take a component's model from another profile
      parsing: {profile: envoy-next, mode: http}   # mode defaults to each mode itself

Scaling multiplies every parameter of the component's latency and CPU models.

:func:`derive_speedup` measures a speedup instead of guessing it: two profiles of one machine
(a baseline and a variant, e.g. Unix-socket IPC or zero-copy writes) compared component by
component, per mode and message size, with intervals; :meth:`Derivation.document` writes it as
a speedup file in the format above (its ``derived`` section records the comparison).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from meshtax.errors import PredictError, clip
from meshtax.model.components import Component, Kind
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import ModeProfile, Profile
from meshtax.model.schema import problems
from meshtax.model.sidecar import Mode

_PCT = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")
_MODES = [m.value for m in Mode]
_PERCENT: dict[str, Any] = {
    "anyOf": [{"type": "number"}, {"type": "string", "pattern": _PCT.pattern}],
    "x-expected": "a percent change like -30% or +10%",
}
_ENTRIES: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            _PERCENT,
            {
                "type": "object",
                "additionalProperties": False,
                "minProperties": 1,
                "properties": {"latency": _PERCENT, "cpu": _PERCENT},
            },
        ],
        "x-expected": "a percent change like -30% or {latency: -40%, cpu: -20%}",
    },
}
#: JSON Schema of a speedup file; numbers are finite (model/schema.py); a percentage is a
#: number or text like ``-30%``, checked for range by :func:`parse_factor`.
SPEEDUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "description": {"type": "string"},
        "scale": _ENTRIES,
        "modes": {
            "type": "object",
            "additionalProperties": False,
            "properties": {m: {"anyOf": [{"type": "null"}, _ENTRIES]} for m in _MODES},
            "x-expected": "per mode (tcp, http, grpc) entries like scale's",
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
        "derived": {"type": "object"},
    },
}


class SpeedupError(PredictError):
    """A speedup file that cannot be used (names the file, the entry and what was expected)."""


@dataclass(frozen=True)
class Replacement:
    profile: str
    mode: Mode | None = None


@dataclass(frozen=True)
class Factor:
    """What one speedup entry multiplies a component's latency and CPU models by."""

    latency: float
    cpu: float

    def __mul__(self, other: Factor) -> Factor:
        return Factor(self.latency * other.latency, self.cpu * other.cpu)

    def describe(self) -> str:
        lat, cpu = 100 * (self.latency - 1), 100 * (self.cpu - 1)
        return f"{lat:+.4g}%" if lat == cpu else f"latency {lat:+.4g}% / CPU {cpu:+.4g}%"


ONE = Factor(1.0, 1.0)


@dataclass(frozen=True)
class Speedup:
    """Factors per target (a component key, ``filters`` or ``all``), in every mode or per mode
    (``by_mode`` entries take the place of ``factors`` in their mode), and replacements."""

    name: str
    factors: Mapping[str, Factor] = field(default_factory=dict)
    replace: Mapping[Component, Replacement] = field(default_factory=dict)
    by_mode: Mapping[Mode, Mapping[str, Factor]] = field(default_factory=dict)

    def for_mode(self, mode: Mode) -> Mapping[str, Factor]:
        return {**self.factors, **self.by_mode.get(mode, {})}

    def describe(self) -> str:
        parts = [f"{k} {f.describe()}" for k, f in self.factors.items()]
        parts += [
            f"{m.value}: {k} {f.describe()}"
            for m, fs in self.by_mode.items()
            for k, f in fs.items()
        ]
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


def _factor(value: Any, where: str) -> Factor:
    """``-30%`` (latency and CPU) or ``{latency: -40%, cpu: -20%}`` (either may be left out)."""
    if not isinstance(value, Mapping):
        f = parse_factor(value, where)
        return Factor(f, f)
    unknown = set(value) - {"latency", "cpu"}
    if unknown or not value:
        raise SpeedupError(f"{where}: expected a percent change or {{latency: X%, cpu: Y%}}")
    return Factor(
        parse_factor(value["latency"], f"{where}.latency") if "latency" in value else 1.0,
        parse_factor(value["cpu"], f"{where}.cpu") if "cpu" in value else 1.0,
    )


def _scale(entries: Any, where: str) -> dict[str, Factor]:
    if not isinstance(entries, Mapping):
        raise SpeedupError(f"{where}: expected a mapping of component: percent change")
    factors: dict[str, Factor] = {}
    for k, v in entries.items():
        key = str(k).strip().lower()
        if key not in ("filters", "all"):
            try:
                key = Component.parse(key).key
            except ValueError as e:
                raise SpeedupError(f"{where}.{k}: {e}") from None
        factors[key] = _factor(v, f"{where}.{k}")
    return factors


def speedup_from_dict(d: Any, source: str = "<speedup>") -> Speedup:
    """A validated speedup (:data:`SPEEDUP_SCHEMA`, then each entry); every problem of the
    schema is raised together."""
    if not isinstance(d, Mapping):
        raise SpeedupError(f"{source}: expected a mapping with 'scale' and/or 'replace'")
    bad = problems(SPEEDUP_SCHEMA, d, limit=10)
    if bad:
        raise SpeedupError(f"{source}: " + "; ".join(bad), file=source)
    factors = _scale(d.get("scale") or {}, f"{source}: scale")
    by_mode: dict[Mode, dict[str, Factor]] = {}
    for m, entries in (d.get("modes") or {}).items():
        try:
            md = Mode(str(m))
        except ValueError:
            raise SpeedupError(f"{source}: modes.{m}: expected tcp, http or grpc") from None
        by_mode[md] = _scale(entries or {}, f"{source}: modes.{m}")
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
    if not factors and not repl and not any(by_mode.values()):
        raise SpeedupError(f"{source}: no 'scale', 'modes' or 'replace' entries; nothing to change")
    return Speedup(str(d.get("name", "speedup")), factors, repl, by_mode)


def apply_speedup(
    profile: Profile, sp: Speedup, lookup: Callable[[str], Profile] | None = None
) -> tuple[Profile, tuple[str, ...]]:
    """The profile after the speedup, and warnings for targets the profile does not have."""
    warnings: list[str] = []
    used: set[str] = set()
    modes = []
    for mode, mp in profile.modes.items():
        factors = sp.for_mode(mode)
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
            f = factors.get(c.key, ONE)
            if c.key in factors:
                used.add(c.key)
            if c.kind is Kind.FILTER and "filters" in factors:
                f *= factors["filters"]
                used.add("filters")
            if "all" in factors:
                f *= factors["all"]
                used.add("all")
            if f != ONE:
                m = ComponentModel(_scaled(m.latency, f.latency), _scaled(m.cpu, f.cpu))
            comps[c] = m
        modes.append(ModeProfile(mode, comps, mp.closure))
    for mode in sp.by_mode:
        if mode not in profile.modes:
            warnings.append(
                f"speedup {sp.name!r}: profile {profile.name!r} has no {mode.value} mode; "
                "its entries change nothing"
            )
    keys = [*sp.factors, *(k for m, fs in sp.by_mode.items() if m in profile.modes for k in fs)]
    for k in dict.fromkeys([*keys, *(c.key for c in sp.replace)]):
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


def _scaled(m: CostModel, f: float) -> CostModel:
    return m if f == 1.0 else m.scaled(f)


# ---- measured speedups ---------------------------------------------------------------------

Z95 = 1.959963984540054  # two-sided 95 % normal quantile
METRICS = ("latency", "cpu")


@dataclass(frozen=True)
class Ratio:
    """Variant ÷ base of one component's latency or CPU model at one message size.

    ``lo``/``hi``: 95 % interval by the delta method on both models' fit covariances (their
    samples' scatter), clipped at 0; None when either model has none (e.g. a published
    profile). ``ratio`` is None when the base costs nothing there (nothing to scale).
    """

    mode: Mode
    component: Component
    metric: str
    size: float
    base: float
    variant: float
    ratio: float | None
    lo: float | None = None
    hi: float | None = None

    @property
    def significant(self) -> bool:
        """The interval excludes 1 (no interval: unknown, so False)."""
        return self.lo is not None and self.hi is not None and not self.lo <= 1.0 <= self.hi

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "component": self.component.key,
            "metric": self.metric,
            "size": self.size,
            "base": self.base,
            "variant": self.variant,
            "ratio": self.ratio,
            "lo": self.lo,
            "hi": self.hi,
        }


def _pct(f: float) -> str:
    return f"{100 * (f - 1):+.6g}%"


@dataclass(frozen=True)
class Derivation:
    """A speedup measured by comparing two profiles of one machine (see :func:`derive_speedup`)."""

    base: str
    variant: str
    platform: str
    sizes: tuple[float, ...]
    rate: float | None
    ratios: tuple[Ratio, ...]
    notes: tuple[str, ...] = ()

    def modes(self) -> tuple[Mode, ...]:
        return tuple(dict.fromkeys(r.mode for r in self.ratios))

    def factors(self, size: float) -> dict[Mode, dict[str, Factor]]:
        """Per mode and component, the ratios at ``size`` as speedup factors (a metric whose
        base costs nothing stays 1)."""
        if size not in self.sizes:
            raise SpeedupError(f"no ratios at {size:g} B; compared at {self.sizes}")
        out: dict[Mode, dict[str, Factor]] = {}
        for r in self.ratios:
            if r.size != size or r.ratio is None:
                continue
            f = out.setdefault(r.mode, {}).get(r.component.key, ONE)
            f = replace(f, **{r.metric: r.ratio})
            out[r.mode][r.component.key] = f
        return out

    def document(
        self, size: float | None = None, name: str | None = None, every_mode: bool = False
    ) -> dict[str, Any]:
        """The speedup file: factors at ``size`` (default: the first size) per mode, or under
        ``scale`` for every mode (``every_mode``, only for a one-mode comparison); the
        ``derived`` section records every ratio with its interval."""
        at = self.sizes[0] if size is None else float(size)
        factors = self.factors(at)

        def entries(fs: Mapping[str, Factor]) -> dict[str, Any]:
            # a component the variant leaves as it is stays out (its ratio is in `derived`)
            return {
                k: {"latency": _pct(f.latency), "cpu": _pct(f.cpu)}
                for k, f in fs.items()
                if f != ONE
            }

        doc: dict[str, Any] = {
            "name": name or f"{self.variant}-vs-{self.base}",
            "description": (
                f"measured: profile {self.variant!r} / {self.base!r} per component at {at:g} B "
                "(meshtax whatif derive)"
            ),
        }
        if every_mode:
            if len(factors) != 1:
                raise SpeedupError(
                    f"every_mode needs a one-mode comparison; this one has "
                    f"{', '.join(m.value for m in factors) or 'none'}"
                )
            doc["scale"] = entries(next(iter(factors.values())))
        else:
            modes = {m.value: entries(fs) for m, fs in factors.items()}
            doc["modes"] = {m: e for m, e in modes.items() if e}
        doc["derived"] = {
            "base": self.base,
            "variant": self.variant,
            "platform": self.platform,
            "size_bytes": at,
            "sizes": list(self.sizes),
            "rate": self.rate,
            "interval": "95 %, delta method on both models' fit covariances; null: no samples",
            "ratios": [r.to_dict() for r in self.ratios],
            "notes": list(self.notes),
        }
        return doc


def _ratio(
    b: CostModel, v: CostModel, size: float, rate: float | None
) -> tuple[float, float, float | None, float | None, float | None]:
    s = np.array([size])
    r = None if rate is None else np.array([rate])
    bv, vv = float(b.predict(s, r)[0]), float(v.predict(s, r)[0])
    if not bv > 0:
        return bv, vv, None, None, None
    ratio = max(vv / bv, 0.0)
    if b.stats is None or b.stats.cov is None or v.stats is None or v.stats.cov is None:
        return bv, vv, ratio, None, None
    se_b, se_v = float(b.stderr_at(s, r)[0]), float(v.stderr_at(s, r)[0])
    se = math.sqrt(se_v**2 + (vv / bv) ** 2 * se_b**2) / bv
    return bv, vv, ratio, max(vv / bv - Z95 * se, 0.0), max(vv / bv + Z95 * se, 0.0)


def derive_speedup(
    base: Profile,
    variant: Profile,
    sizes: Sequence[float] = (100.0, 4096.0),
    rate: float | None = None,
) -> Derivation:
    """Compare ``variant`` with ``base`` component by component: the ratio of their latency
    and CPU models per mode (both have) and message size, at ``rate`` (None: each model's
    highest profiled rate). Profiles of different hosts are refused: a ratio across machines
    would mix the optimization with the machine."""
    if not sizes:
        raise SpeedupError("derive: no message sizes to compare at")
    if not base.platform.same_host(variant.platform):
        raise SpeedupError(
            f"derive: {base.name!r} ({base.platform.describe()}) and {variant.name!r} "
            f"({variant.platform.describe()}) were measured on different hosts"
        )
    modes = [m for m in base.modes if m in variant.modes]
    if not modes:
        raise SpeedupError(f"derive: {base.name!r} and {variant.name!r} share no protocol mode")
    ratios: list[Ratio] = []
    notes: list[str] = []
    for mode in modes:
        bc, vc = base.modes[mode].components, variant.modes[mode].components
        for c in sorted(set(bc) - set(vc)):
            notes.append(f"{mode.value} {c.key}: only in {base.name!r}; not scaled")
        for c in sorted(set(vc) - set(bc)):
            notes.append(f"{mode.value} {c.key}: only in {variant.name!r}; a scale cannot add it")
        for c in sorted(set(bc) & set(vc)):
            for metric in METRICS:
                bm, vm = getattr(bc[c], metric), getattr(vc[c], metric)
                for size in sizes:
                    bv, vv, ratio, lo, hi = _ratio(bm, vm, float(size), rate)
                    if ratio is None:
                        notes.append(
                            f"{mode.value} {c.key} {metric} at {size:g} B: base {bv:.4g} ≤ 0; "
                            "not scaled"
                        )
                    elif vv < 0:
                        notes.append(
                            f"{mode.value} {c.key} {metric} at {size:g} B: variant {vv:.4g} < 0; "
                            "ratio clipped to 0"
                        )
                    ratios.append(Ratio(mode, c, metric, float(size), bv, vv, ratio, lo, hi))
    return Derivation(
        base.name,
        variant.name,
        base.platform.describe(),
        tuple(float(s) for s in sizes),
        rate,
        tuple(ratios),
        tuple(notes),
    )
