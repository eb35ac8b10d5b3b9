"""Profile validation (pure): a document's types against :data:`PROFILE_SCHEMA` (finite,
bounded numbers), then :func:`profile_problems` on the built profile (ordered intervals,
consistent samples, no negative total cost where it was measured). Used by
:meth:`meshtax.model.profile.Profile.from_dict`; every problem is raised together."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from meshtax.errors import ModelError
from meshtax.model.capacity import LIMITS
from meshtax.model.components import Component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.sidecar import Mode

if TYPE_CHECKING:
    from meshtax.model.profile import ModeProfile, Profile

__all__ = ["CHECK_SIZES", "PROFILE_SCHEMA", "ProfileError", "doc_problems", "profile_problems"]


class ProfileError(ModelError):
    """A profile document or profile whose values cannot be used; lists every problem."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"{source}: not a usable profile, {len(self.problems)} problem(s):\n{lines}",
            file=source,
        )


# bounds far beyond any real value, so no product of a few of them overflows a float
_BIG = 1e12
_NUM: dict[str, Any] = {"type": "number", "minimum": -_BIG, "maximum": _BIG}
_NONNEG: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": _BIG}
_POS: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e9}  # rates
_OPT_POS: dict[str, Any] = {"anyOf": [{"type": "null"}, _POS]}
_MODES = [m.value for m in Mode]
_NONNEG_RATE: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1e9}
_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 1 << 40}
_QUANTILES: dict[str, Any] = {"type": "array", "minItems": 2, "maxItems": 1000, "items": _NONNEG}

#: JSON Schema of a profile document (format 1); unknown fields are allowed (newer writers
#: add optional ones), every known one is checked. Numbers are finite (model/schema.py).
# a capacity document's runs: the ramp's (``points``) and its repeated top rates (``repeats``)
_CAPACITY_RUNS: dict[str, Any] = {
    "type": "array",
    "maxItems": 1000,
    "items": {
        "type": "object",
        "required": ["target", "achieved", "sidecar_cpu", "shared_cpu"],
        "properties": {k: _NONNEG for k in ("target", "achieved", "sidecar_cpu", "shared_cpu")},
    },
}

PROFILE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["name", "platform", "provenance", "modes"],
    "properties": {
        "format": {"type": "integer", "minimum": 1},
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "platform": {
            "type": "object",
            "required": ["cpu_model", "cores", "kernel"],
            "properties": {
                "cpu_model": {"type": "string"},
                "cores": {"type": "integer", "minimum": 0},
                "kernel": {"type": "string"},
                "proxy": {"type": "string"},
                "proxy_version": {"type": "string"},
                "config_hash": {"type": "string"},
                "variant": {"type": "string", "maxLength": 200},
                "architecture": {"enum": ["node-l4", "waypoint"]},
            },
        },
        "provenance": {
            "type": "object",
            "required": ["source", "by", "created"],
            "properties": {
                "source": {"type": "string"},
                "by": {"type": "string"},
                "created": {"type": "string"},
                "tool_version": {"type": "string"},
                "options": {"type": "object"},
                "notes": {"type": "array", "items": {"type": "string"}},
            },
        },
        "modes": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"enum": _MODES},
            "additionalProperties": {"$ref": "#/$defs/mode"},
        },
        "colocation": {"type": "object"},  # written by older versions; not used
        "microarch": {"$ref": "#/$defs/microarch"},
        "transfer": {  # model.transfer.Transfer (issue #14)
            "type": "object",
            "required": ["source"],
            # ``modes``: one factor per mode, as the first transfers were written (main at 0a3f92e)
            "anyOf": [{"required": ["factors"]}, {"required": ["modes"]}],
            "properties": {
                "source": {"type": "string", "maxLength": 2000},
                "factors": {"$ref": "#/$defs/key_factors"},
                "modes": {
                    "type": "object",
                    "propertyNames": {"enum": _MODES},
                    "additionalProperties": {"$ref": "#/$defs/key_transfer"},
                },
                "latency_factors": {"$ref": "#/$defs/key_factors"},
            },
        },
    },
    "$defs": {
        "key_factors": {  # per cost model (model.transfer.key)
            "type": "object",
            "propertyNames": {"pattern": "^(tcp|http|grpc)(\\+(http|grpc))?$"},
            "additionalProperties": {"$ref": "#/$defs/key_transfer"},
        },
        "key_transfer": {
            "type": "object",
            "required": ["factor", "lo", "hi", "cases"],
            "properties": {
                "factor": _POS,
                "lo": _NUM,
                "hi": _NUM,
                "cases": _COUNT,
                "coverage": {"type": "number", "minimum": 0, "maximum": 1},
            },
        },
        "events": {"type": "object", "additionalProperties": _NUM},
        "microarch": {  # model.microarch.Microarch (issue #19)
            "type": "object",
            "required": ["source", "rows"],
            "properties": {
                "format": {"type": "integer", "minimum": 1},
                "source": {"type": "string"},
                "tool": {"type": "string"},
                "geometry": {"anyOf": [{"type": "null"}, {"type": "object"}]},
                "notes": {"type": "array", "items": {"type": "string"}},
                "rows": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["mode", "variant", "size", "n1", "n2", "per_request"],
                        "properties": {
                            "mode": {"enum": _MODES},
                            "variant": {"type": "string"},
                            "size": {"type": "integer", "minimum": 0},
                            "n1": {"type": "integer", "minimum": 0},
                            "n2": {"type": "integer", "minimum": 1},
                            "warmup_n": {"type": "integer", "minimum": 0},
                            "per_request": {"$ref": "#/$defs/events"},
                            "fixed": {"$ref": "#/$defs/events"},
                            "warmup": {"$ref": "#/$defs/events"},
                            "main": {"$ref": "#/$defs/events"},  # format 1
                            "background": {"$ref": "#/$defs/events"},
                            "pairs": {"type": "array", "items": {"$ref": "#/$defs/events"}},
                            "members": {"type": "array", "items": {"type": "string"}},
                            "rounds": {
                                "type": "array",
                                "items": {
                                    "type": "array",
                                    "items": {"type": "integer", "minimum": 0},
                                    "minItems": 2,
                                    "maxItems": 2,
                                },
                            },
                            "unresolved": {"type": "array", "items": {"type": "string"}},
                            "earlier": {
                                "type": "array",
                                "items": {"type": "array", "items": {"$ref": "#/$defs/events"}},
                            },
                            "by_part": {
                                "type": "object",
                                "additionalProperties": {"$ref": "#/$defs/events"},
                            },
                        },
                    },
                },
                "kernel": {"type": "array", "items": {"type": "object"}},
            },
        },
        "cost": {
            "type": "object",
            "properties": {
                "intercept": _NUM,
                "slope": _NUM,
                "split_bytes": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 1}]},
                "per_unit": _NUM,
                "rate_coef": _NUM,
                "rate_lo": _OPT_POS,
                "rate_hi": _OPT_POS,
                "note": {"type": "string"},
                "stats": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "required": ["n"],
                            "properties": {
                                "n": {"type": "integer", "minimum": 0},
                                "r2": {"anyOf": [{"type": "null"}, _NUM]},
                                "residuals": {"type": "array", "items": _NUM},
                                "stderr": {
                                    "type": "array",
                                    "maxItems": 4,
                                    "items": {"anyOf": [{"type": "null"}, _NONNEG]},
                                },
                                "cov": {
                                    "anyOf": [
                                        {"type": "null"},
                                        {
                                            "type": "array",
                                            "maxItems": 4,
                                            "items": {
                                                "type": "array",
                                                "maxItems": 4,
                                                "items": _NUM,
                                            },
                                        },
                                    ]
                                },
                            },
                        },
                    ]
                },
                "samples": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "required": ["sizes", "values"],
                            "properties": {
                                "sizes": {"type": "array", "items": _NONNEG},
                                "values": {"type": "array", "items": _NUM},
                                "rates": {
                                    "anyOf": [{"type": "null"}, {"type": "array", "items": _POS}]
                                },
                            },
                        },
                    ]
                },
            },
        },
        "opt_cost": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/cost"}]},
        "component": {
            "type": "object",
            "required": ["latency", "cpu"],
            "properties": {"latency": {"$ref": "#/$defs/cost"}, "cpu": {"$ref": "#/$defs/cost"}},
        },
        "opt_component": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/component"}]},
        "components": {
            "type": "object",
            "propertyNames": {"minLength": 1, "maxLength": 200},
            "additionalProperties": {"$ref": "#/$defs/component"},
        },
        "mode": {
            "type": "object",
            "required": ["mode", "components"],
            "properties": {
                "mode": {"enum": _MODES},
                "components": {"$ref": "#/$defs/components"},
                "closure": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "required": [
                                "measured_us",
                                "measured_lo_us",
                                "measured_hi_us",
                                "components_us",
                                "tolerance",
                            ],
                            "properties": {
                                "measured_us": _NUM,
                                "measured_lo_us": _NUM,
                                "measured_hi_us": _NUM,
                                "components_us": _NUM,
                                "tolerance": _NONNEG,
                            },
                        },
                    ]
                },
                "memory": {"$ref": "#/$defs/opt_cost"},
                "memory_mtls": {"$ref": "#/$defs/opt_cost"},
                "tls_handshake": {"$ref": "#/$defs/opt_component"},
                "carried": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "propertyNames": {"enum": ["http", "grpc"]},
                            "additionalProperties": {"$ref": "#/$defs/mode"},
                        },
                    ]
                },
                "tls_version": {"anyOf": [{"type": "null"}, {"type": "string"}]},
                "tls_by_version": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "required": ["version"],
                                "properties": {
                                    "version": {"type": "string"},
                                    "per_message": {"$ref": "#/$defs/opt_component"},
                                    "handshake": {"$ref": "#/$defs/opt_component"},
                                },
                            },
                        },
                    ]
                },
                "per_connection": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/components"}]},
                "capacity": {"$ref": "#/$defs/capacity"},  # absent when not measured
                "latency_sketches": {
                    "type": "array",
                    "maxItems": 100,
                    "items": {"$ref": "#/$defs/sketch"},
                },
                # CPU-µs per second of an idle proxy: at most all of a CPU
                "idle_cpu_us_per_s": {"type": "number", "minimum": 0, "maximum": 1e6},
            },
        },
        # issue #20 (model/capacity.py): a sidecar under load, and latency quantiles per size
        "capacity": {
            "type": "object",
            "required": [
                "requests_per_s",
                "size_bytes",
                "connections",
                "workers",
                "sidecar_cpu_us",
                "limited_by",
            ],
            "properties": {
                "requests_per_s": _NONNEG_RATE,
                "size_bytes": _COUNT,
                "connections": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                "workers": {"type": "integer", "minimum": 1, "maximum": 4096},
                "sidecar_cpu_us": _NONNEG,
                "limited_by": {"enum": list(LIMITS)},
                "direct_requests_per_s": _NONNEG_RATE,
                "cpus": {"type": "integer", "minimum": 1, "maximum": 4096},
                "closed_loop": {
                    "type": "array",
                    "maxItems": 100,
                    "items": {
                        "type": "array",
                        "minItems": 2,
                        "maxItems": 2,
                        "items": _NONNEG_RATE,
                    },
                },
                "points": _CAPACITY_RUNS,
                "repeats": _CAPACITY_RUNS,
            },
        },
        "sketch": {
            "type": "object",
            "required": ["size", "probs", "meshed_us", "direct_us"],
            "properties": {
                "size": _COUNT,
                "probs": _QUANTILES | {"items": {"type": "number", "minimum": 0, "maximum": 1}},
                "meshed_us": _QUANTILES,
                "direct_us": _QUANTILES,
                "requests": _COUNT,
            },
        },
    },
}


def _cost_problems(where: str, m: CostModel) -> list[str]:
    out = []
    if m.rate_lo is not None and m.rate_hi is not None and m.rate_lo > m.rate_hi:
        out.append(f"{where}: rate_lo {m.rate_lo:g} > rate_hi {m.rate_hi:g}; expected lo ≤ hi")
    if (m.rate_lo is None) != (m.rate_hi is None):
        out.append(f"{where}: rate_lo and rate_hi: one is missing; expected both or neither")
    if m.rate_coef and m.rate_lo is None:
        out.append(f"{where}: rate_coef without rate_lo/rate_hi; expected the profiled range")
    s = m.samples
    if s is not None and (
        len(s.sizes) != len(s.values) or (s.rates is not None and len(s.rates) != len(s.sizes))
    ):
        out.append(f"{where}.samples: sizes, values and rates differ in length")
    if m.stats is not None and m.stats.cov is not None:
        c = m.stats.cov
        if any(len(r) != len(c) for r in c) or len(c) not in (3, 4):
            out.append(f"{where}.stats.cov: not a 3×3 or 4×4 matrix")
        elif any(c[i][i] < 0 for i in range(len(c))):
            out.append(f"{where}.stats.cov: a negative variance on the diagonal")
    return out


#: sizes (bytes) a mode's total cost is checked at besides its samples' sizes: the engine
#: extrapolates linearly, so a total that turns negative anywhere up to 1 GiB is refused
CHECK_SIZES = (0.0, 100.0, float(1 << 20), float(1 << 30))


def _grid(models: Iterable[CostModel]) -> tuple[list[float], list[float | None]]:
    """Sizes and rates to check a set of models at: :data:`CHECK_SIZES` and their samples'
    sizes, and the ends of their rate ranges (None: the highest profiled rate)."""
    ms = list(models)
    sizes = sorted({float(x) for m in ms if m.samples for x in m.samples.sizes} | set(CHECK_SIZES))
    ends = {r for m in ms for r in (m.rate_lo, m.rate_hi) if r is not None}
    return sizes, [None, *sorted(ends)]


def _total_problems(where: str, mp: ModeProfile) -> list[str]:
    """The mode's total cost must not be negative at any size the engine may price (see
    :data:`CHECK_SIZES`): base components alone, with mTLS, and with each filter. Single
    components may be (they are differences of measurements: profile/decompose.py)."""
    base = {c: m for c, m in mp.components.items() if c.name == "" and c.key != "tls"}
    extras: list[tuple[str, dict[Component, ComponentModel]]] = [("", {})]
    extras += [(f" with {c.key}", {c: m}) for c, m in mp.components.items() if c not in base]
    out = []
    for label, extra in extras:
        parts = {**base, **extra}
        for metric in ("latency", "cpu"):
            models = [getattr(m, metric) for m in parts.values()]
            if not models:
                continue
            sizes, rates = _grid(models)
            for r in rates:
                total = np.sum([m.predict(sizes, r) for m in models], axis=0)
                worst = float(total.min())
                if worst < -1e-9 * max(1.0, float(np.abs(total).max())):
                    out.append(
                        f"{where}: total {metric}{label} is {worst:.4g} at some size up to "
                        "1 GiB; expected ≥ 0 (a sidecar cannot save time or CPU)"
                    )
                    break
    return out


def _mode_problems(where: str, mp: ModeProfile) -> list[str]:
    out: list[str] = []
    named: list[tuple[str, CostModel]] = []
    for c, cm in mp.components.items():
        named += [(f"{where}.components.{c.key}.latency", cm.latency)]
        named += [(f"{where}.components.{c.key}.cpu", cm.cpu)]
    for c, cm in mp.per_connection.items():
        named += [
            (f"{where}.per_connection.{c.key}.{k}", getattr(cm, k)) for k in ("latency", "cpu")
        ]
    for key in ("memory", "memory_mtls"):
        m = getattr(mp, key)
        if m is not None:
            named.append((f"{where}.{key}", m))
            if m.intercept < 0:
                out.append(f"{where}.{key}.intercept: {m.intercept:g} bytes; expected ≥ 0")
    if mp.tls_handshake is not None:
        named += [(f"{where}.tls_handshake.latency", mp.tls_handshake.latency)]
        named += [(f"{where}.tls_handshake.cpu", mp.tls_handshake.cpu)]
    for w, m in named:
        out += _cost_problems(w, m)
    if mp.closure is not None and mp.closure.measured_lo_us > mp.closure.measured_hi_us:
        out.append(f"{where}.closure: measured_lo_us > measured_hi_us; expected lo ≤ hi")
    out += _total_problems(where, mp)
    for size, sk in mp.latency_sketches.items():
        if any(b < a for a, b in zip(sk.probs, sk.probs[1:])):
            out.append(f"{where}.latency_sketches[{size}].probs: not in ascending order")
    for proto, sub in mp.carried.items():
        out += _mode_problems(f"{where}.carried.{proto}", sub)
    return out


def profile_problems(p: Profile) -> list[str]:
    """What makes a profile unusable beyond its document's types: unordered intervals,
    inconsistent samples, a negative total cost where it was measured."""
    out: list[str] = []
    for mode, mp in p.modes.items():
        out += _mode_problems(f"modes.{mode.value}", mp)
    return out


def doc_problems(d: Any, current_format: int) -> list[str]:
    """Problems of a profile document's types (``current_format``: the newest this reads)."""
    from meshtax.model.schema import problems

    if not isinstance(d, Mapping):
        return [f"(top level): a {type(d).__name__}; expected a profile document (a mapping)"]
    fmt = d.get("format", current_format)
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > current_format:
        return [f"format: {fmt} is newer than this meshtax understands ({current_format})"]
    return problems(PROFILE_SCHEMA, d)
