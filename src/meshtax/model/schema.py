"""JSON Schema validation for every document format (ECG, profile, speedup), with one rule
the standard leaves out: a ``number`` is finite (NaN and ±infinity are not numbers here, and
neither is an integer too large for a float), and booleans are never numbers.

Problems come back as ``field: value; expected …`` lines, values clipped so a message never
carries a whole input.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from meshtax.errors import clip


def _finite_number(checker: Any, x: Any) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _finite_integer(checker: Any, x: Any) -> bool:
    if isinstance(x, float):
        return x.is_integer() and abs(x) < 2.0**63
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**63


_TYPES = Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"number": _finite_number, "integer": _finite_integer}
)
FiniteValidator: Any = jsonschema.validators.extend(Draft202012Validator, type_checker=_TYPES)


def validator(schema: Mapping[str, Any]) -> Any:
    """A (cached) validator of ``schema`` with finite numbers."""
    return FiniteValidator(schema)


def path_text(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


_TYPE_WORDS = {
    "number": "a finite number",
    "integer": "a whole number",
    "string": "text",
    "object": "a mapping",
    "array": "a list",
    "boolean": "true or false",
    "null": "nothing (null)",
}


def _type_name(x: Any) -> str:
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, float) and not math.isfinite(x):
        return "not a finite number"
    return {
        dict: "a mapping",
        list: "a list",
        str: "text",
        int: "an integer",
        float: "a number",
        type(None): "nothing (null)",
    }.get(type(x), f"a {type(x).__name__}")


def describe(err: jsonschema.ValidationError, where: str | None = None) -> str:
    """One line for one schema violation: the field, what it holds, what was expected."""
    at = where if where is not None else path_text(err.absolute_path)
    v, inst, want = err.validator, err.instance, err.validator_value
    desc = err.schema.get("x-expected") if isinstance(err.schema, Mapping) else None
    if desc and v in ("type", "anyOf", "oneOf", "pattern", "enum"):
        return f"{at}: {clip(inst)}; expected {desc}"
    if v == "type":
        types = [want] if isinstance(want, str) else list(want)
        expected = " or ".join(_TYPE_WORDS.get(t, t) for t in types)
        return f"{at}: {clip(inst)} is {_type_name(inst)}; expected {expected}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}[v]
        return f"{at}: {clip(inst)}; expected a number {op} {want}"
    if v == "enum":
        return f"{at}: {clip(inst)}; expected one of {', '.join(map(str, want))}"
    if v == "const":
        return f"{at}: {clip(inst)}; expected {want!r}"
    if v == "required":
        missing = [k for k in want if isinstance(inst, Mapping) and k not in inst]
        return f"{at}: missing {', '.join(repr(k) for k in missing)}"
    if v == "additionalProperties" and isinstance(inst, Mapping):
        allowed = set((err.schema or {}).get("properties", {}))
        extra = sorted(str(k) for k in inst if k not in allowed)
        return f"{at}: unknown field(s) {', '.join(clip(k, 30) for k in extra[:5])}" + (
            f"; expected {', '.join(sorted(allowed))}" if allowed else ""
        )
    if v in ("minItems", "minProperties"):
        return f"{at}: empty; expected at least {want}"
    if v in ("maxItems", "maxProperties"):
        return f"{at}: more than {want} entries"
    if v == "minLength":
        return f"{at}: empty text; expected at least {want} character(s)"
    if v == "maxLength":
        return f"{at}: text longer than {want} characters"
    if v == "pattern":
        return f"{at}: {clip(inst)}; expected text matching {want}"
    if v == "propertyNames":
        return f"{at}: a field name is not allowed ({err.message[:80]})"
    return f"{at}: {clip(inst)} does not fit the format ({v})"


def problems(schema: Mapping[str, Any], doc: Any, limit: int = 50) -> list[str]:
    """Every schema violation of ``doc`` as text (at most ``limit``, then a count)."""
    errs = sorted(
        validator(schema).iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]
    )
    out = [describe(e) for e in errs[:limit]]
    if len(errs) > limit:
        out.append(f"… and {len(errs) - limit} more")
    return out
