"""Read ECG files (YAML or JSON, format ``meshtax-ecg/1``; see docs/ecg-format.md).

Every problem is reported with the file, the field and what was expected; all problems of a
file are reported together; nothing raises anything but :class:`ECGError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

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
from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig


@cache
def ecg_schema() -> dict[str, Any]:
    return dict(
        json.loads(resources.files("meshtax").joinpath("schemas/ecg.schema.json").read_text())
    )


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _describe(err: jsonschema.ValidationError) -> str:
    return _describe_at(_path(err.absolute_path), err)


def _describe_at(where: str, err: jsonschema.ValidationError) -> str:
    v, inst = err.validator, err.instance
    if v == "minimum":
        return f"{where}: {inst!r}; expected a number ≥ {err.validator_value}"
    if v == "type":
        return f"{where}: {inst!r} is a {type(inst).__name__}; expected {err.validator_value}"
    if v == "required":
        return f"{where}: {err.message}"
    if v == "additionalProperties":
        return f"{where}: {err.message} (see docs/ecg-format.md for the fields)"
    if v == "oneOf" and where == "(top level)":
        return f"{where}: expected exactly one of 'invocations' or 'graphs'"
    if v == "oneOf" and isinstance(inst, Mapping) and err.context:
        # a sidecar mapping: say which of its fields is wrong, not only that the whole is
        inner = [c for c in err.context if c.path]
        if inner:
            sub = max(inner, key=lambda c: len(c.path))
            return _describe_at(f"{where}.{_path(sub.path)}", sub)
    if v == "oneOf":
        return (
            f"{where}: {inst!r}; expected 'none', a mode (tcp, http, grpc) or "
            "{mode, filters, mtls, tls_version, architecture}"
        )
    return f"{where}: {err.message}"


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
    errors = sorted(
        jsonschema.Draft202012Validator(ecg_schema()).iter_errors(doc),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    if errors:
        raise ECGError(source, [_describe(e) for e in errors])
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


def load_ecg_file(path: str | Path) -> list[ECG]:
    """All call graphs of one ECG file (YAML or JSON)."""
    p = Path(path)
    src = str(p)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ECGError(src, ["file not found"]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ECGError(src, [f"cannot read: {e.__class__.__name__}: {e}"]) from None
    if not text.strip():
        raise ECGError(
            src, ["the file is empty; expected an ECG with 'services' and 'invocations'"]
        )
    try:
        doc = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise ECGError(
            src, [f"line {e.lineno} column {e.colno}: JSON syntax error: {e.msg}"]
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise ECGError(src, [f"{where}YAML syntax error: {getattr(e, 'problem', e)}"]) from None
    notes: list[str] = []
    if isinstance(doc, dict) and _has_sidecar_refs(doc):
        # sidecars described as users write them: an Envoy config or Kubernetes/Istio manifests
        from meshtax.traces.envoy_config import ConfigImportError
        from meshtax.traces.k8s import resolve_sidecar_refs_with_report

        try:
            doc, notes = resolve_sidecar_refs_with_report(doc, p.parent)
        except ConfigImportError as e:
            raise ECGError(src, [str(e)]) from None
    ecgs = ecgs_from_dict(doc, src)
    return [replace(e, meta={**e.meta, "notes": tuple(notes)}) for e in ecgs] if notes else ecgs


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
