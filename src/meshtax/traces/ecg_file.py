"""Read ECG files (YAML or JSON, format ``meshtax-ecg/1``; see docs/ecg-format.md).

Every problem is reported with the file, the field and what was expected; all problems of a
file are reported together; nothing raises anything but :class:`ECGError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from meshtax import safeio
from meshtax.errors import MeshtaxError, clip
from meshtax.model.ecg import (
    DEFAULT_MESSAGE_BYTES,
    DEFAULT_RATE_RPS,
    ECG,
    EXTERNAL,
    ECGError,
    Invocation,
    Service,
    validate,
)
from meshtax.model.schema import describe, path_text, validator
from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig


@cache
def ecg_schema() -> dict[str, Any]:
    return dict(
        json.loads(resources.files("meshtax").joinpath("schemas/ecg.schema.json").read_text())
    )


def _describe(err: jsonschema.ValidationError, prefix: str = "") -> str:
    where = path_text(err.absolute_path)
    if prefix:
        where = (
            prefix
            if where == "(top level)"
            else prefix + (where if where.startswith("[") else "." + where)
        )
    v, inst = err.validator, err.instance
    if v == "oneOf" and where == "(top level)":
        return f"{where}: expected exactly one of 'invocations' or 'graphs'"
    if v == "oneOf" and isinstance(inst, Mapping) and err.context:
        # a sidecar mapping: say which of its fields is wrong, not only that the whole is
        inner = [c for c in err.context if c.path]
        if inner:
            sub = max(inner, key=lambda c: len(c.path))
            return describe(sub, f"{where}.{path_text(sub.path)}")
    if v == "oneOf":
        return (
            f"{where}: {clip(inst)}; expected 'none', a mode (tcp, http, grpc) or "
            "{mode, filters, mtls, tls_version, architecture}"
        )
    return describe(err, where)


# ---- fast path for invocations --------------------------------------------------------------
# Large graphs have 10^5-10^6 invocations; jsonschema takes ~100 µs each. A check compiled
# from the same schema passes the clean ones (it is never looser than the schema); only the
# others go through jsonschema, for its exact messages.


def _value_check(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> Callable[[Any], bool]:
    if "$ref" in prop and len(prop) <= 2:
        prop = {
            **defs[prop["$ref"].rsplit("/", 1)[-1]],
            **{k: v for k, v in prop.items() if k != "$ref"},
        }
    known = {"type", "minimum", "maximum", "minLength", "enum", "description"}
    if set(prop) - known:
        return lambda v: False
    if "enum" in prop:
        allowed = frozenset(x for x in prop["enum"] if isinstance(x, str))
        return lambda v: type(v) is str and v in allowed
    t = prop.get("type")
    if t == "string":
        n = int(prop.get("minLength", 0))
        return lambda v: type(v) is str and len(v) >= n
    if t == "number":
        lo = float(prop.get("minimum", -math.inf))
        hi = float(prop.get("maximum", math.inf))

        def num(v: Any) -> bool:
            tv = type(v)
            if tv is float:
                return math.isfinite(v) and lo <= v <= hi
            return tv is int and -(2**53) < v < 2**53 and lo <= v <= hi

        return num
    return lambda v: False


@cache
def _invocation_checks() -> tuple[Callable[[Any], bool], Any]:
    schema = ecg_schema()
    item = schema["$defs"]["invocations"]["items"]
    props = item["properties"]
    checks = {k: _value_check(v, schema["$defs"]) for k, v in props.items()}
    required = tuple(item.get("required", ()))

    def ok(x: Any) -> bool:
        if type(x) is not dict:
            return False
        for k in required:
            if k not in x:
                return False
        for k, v in x.items():
            c = checks.get(k)
            if c is None or not c(v):
                return False
        return True

    return ok, validator({"$defs": schema["$defs"], **item})


def _skeleton_schema() -> dict[str, Any]:
    """The ECG schema with invocation lists checked as lists only (items: the fast path)."""
    schema: dict[str, Any] = json.loads(json.dumps(ecg_schema()))
    schema["$defs"]["invocations"] = {"type": "array", "minItems": 1}
    return schema


_SKELETON = cache(_skeleton_schema)


def _schema_problems(doc: Mapping[str, Any], limit: int = 50) -> list[str]:
    errors = sorted(
        validator(_SKELETON()).iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]
    )
    out = [_describe(e) for e in errors]
    ok, item_validator = _invocation_checks()
    lists: list[tuple[str, Any]] = [("invocations", doc.get("invocations"))]
    graphs = doc.get("graphs")
    if isinstance(graphs, list):
        lists += [
            (f"graphs[{i}].invocations", g.get("invocations"))
            for i, g in enumerate(graphs)
            if isinstance(g, Mapping)
        ]
    for where, invs in lists:
        if not isinstance(invs, list):
            continue
        for i, x in enumerate(invs):
            if len(out) > limit:
                break
            if not ok(x):
                out += [_describe(e, f"{where}[{i}]") for e in item_validator.iter_errors(x)]
    if len(out) > limit:
        out = out[:limit] + ["… and more (the first 50 problems are shown)"]
    return out


def parse_sidecar(value: Any, default: SidecarConfig) -> SidecarConfig:
    if value is None:
        return default
    if isinstance(value, str):
        return NO_SIDECAR if value == "none" else SidecarConfig(mode=Mode(value))
    merged = {**default.to_dict(), **value}
    if not merged.get("mtls") and "tls_version" not in value:
        merged.pop(
            "tls_version", None
        )  # mTLS switched off here: the default's version goes with it
    return SidecarConfig.from_dict(merged)


def ecgs_from_dict(doc: Any, source: str) -> list[ECG]:
    """Validate a parsed document against the schema and the ECG semantics."""
    if not isinstance(doc, Mapping):
        raise ECGError(
            source,
            [
                f"(top level): a {type(doc).__name__}; expected a mapping with 'services' and 'invocations'"
            ],
        )
    schema_bad = _schema_problems(doc)
    if schema_bad:
        raise ECGError(source, schema_bad)
    defaults = doc.get("defaults", {})
    try:
        default_sidecar = parse_sidecar(defaults.get("sidecar"), SidecarConfig())
    except ValueError as e:
        raise ECGError(source, [f"defaults.sidecar: {e}"]) from None
    services: dict[str, Service] = {}
    bad: list[str] = []
    for name, s in doc["services"].items():
        try:
            sidecar = parse_sidecar(s.get("sidecar"), default_sidecar)
        except ValueError as e:
            bad.append(f"services.{name}.sidecar: {e}")
            continue
        services[name] = Service(
            name, sidecar, s.get("platform", defaults.get("platform")), s.get("connections")
        )
    if bad:
        raise ECGError(source, bad)
    graphs = doc.get("graphs") or [{"name": doc.get("name"), "invocations": doc["invocations"]}]
    base_name = doc.get("name") or Path(source).stem
    out: list[ECG] = []
    problems: list[str] = []
    for gi, g in enumerate(graphs):
        rate = float(g.get("rate", doc.get("rate", DEFAULT_RATE_RPS)))
        raw = g["invocations"]
        ids = [str(r.get("id", f"#{i}")) for i, r in enumerate(raw)]
        callee_of = dict(zip(ids, (r["callee"] for r in raw)))
        invs = []
        for i, r in enumerate(raw):
            parent = r.get("parent")
            caller = r.get("caller")
            if caller is None:
                caller = callee_of.get(parent, EXTERNAL) if parent is not None else EXTERNAL
            invs.append(
                Invocation(
                    id=ids[i],
                    caller=caller,
                    callee=r["callee"],
                    request_bytes=float(
                        r.get("request_bytes", defaults.get("request_bytes", DEFAULT_MESSAGE_BYTES))
                    ),
                    response_bytes=float(
                        r.get(
                            "response_bytes", defaults.get("response_bytes", DEFAULT_MESSAGE_BYTES)
                        )
                    ),
                    rate=float(r.get("rate", rate)),
                    start_us=float(r.get("start_us", 0.0)),
                    duration_us=float(r.get("duration_us", 0.0)),
                    parent=parent,
                    protocol=str(r.get("protocol", defaults.get("protocol", ""))),
                    new_connections=float(
                        r.get("new_connections", defaults.get("new_connections", 0.0))
                    ),
                )
            )
        name = g.get("name") or (base_name if len(graphs) == 1 else f"{base_name}#{gi}")
        try:
            out.append(validate(name, services, invs, source))
        except ECGError as e:
            prefix = f"graphs[{gi}]." if "graphs" in doc else ""
            problems += [prefix + p for p in e.problems]
    if problems:
        raise ECGError(source, problems)
    return out


def load_ecg_file(path: str | Path, allow_outside: Sequence[str | Path] = ()) -> list[ECG]:
    """All call graphs of one ECG file (YAML or JSON), read with :mod:`meshtax.safeio`.

    ``from_envoy``/``sidecars_from_k8s`` references must resolve inside the file's own
    directory or one of ``allow_outside``.
    """
    p = Path(path)
    src = str(p)
    try:
        doc = safeio.load_document(p, "an ECG file (YAML or JSON)", nonfinite=True)
    except MeshtaxError as e:
        raise ECGError(src, [_without(str(e), src)]) from None
    notes: list[str] = []
    if isinstance(doc, dict) and _has_sidecar_refs(doc):
        # sidecars described as users write them: an Envoy config or Kubernetes/Istio manifests
        from meshtax.traces.envoy_config import ConfigImportError
        from meshtax.traces.k8s import resolve_sidecar_refs_with_report

        try:
            doc, notes = resolve_sidecar_refs_with_report(doc, p.parent, allow_outside)
        except ConfigImportError as e:
            raise ECGError(src, [str(e)]) from None
    ecgs = ecgs_from_dict(doc, src)
    return [replace(e, meta={**e.meta, "notes": tuple(notes)}) for e in ecgs] if notes else ecgs


def _without(message: str, src: str) -> str:
    """A message without its leading ``FILE:`` (ECGError puts the file first itself)."""
    return message[len(src) + 2 :] if message.startswith(src + ": ") else message


def _has_sidecar_refs(doc: Mapping[str, Any]) -> bool:
    if "sidecars_from_k8s" in doc:
        return True
    services = doc.get("services")
    return isinstance(services, Mapping) and any(
        isinstance(s, Mapping)
        and isinstance(s.get("sidecar"), Mapping)
        and "from_envoy" in s["sidecar"]
        for s in services.values()
    )
