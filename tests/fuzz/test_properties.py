"""Property tests of the boundary (hypothesis): safe parsing agrees with the standard parsers
on good input, and any value anywhere in a profile, ECG or speedup document gives a clean
error or a result that is finite, non-negative and ordered."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshtax import safeio
from meshtax.errors import MeshtaxError
from meshtax.model.ecg import to_batch
from meshtax.model.profile import Profile
from meshtax.predict.engine import predict_batch
from meshtax.predict.whatif import apply_speedup, speedup_from_dict
from meshtax.store.reference import reference_profile
from meshtax.traces.ecg_file import ecgs_from_dict

EXAMPLES = int(os.environ.get("MESHTAX_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

keys = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=8)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=20)
)
documents = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=30,
)


@SETTINGS
@given(documents, st.booleans())
def test_yaml_reads_like_pyyaml(doc: Any, flow: bool) -> None:
    text = yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=True)
    assert safeio.parse_yaml(text, "t.yaml") == yaml.safe_load(text)


@SETTINGS
@given(documents)
def test_yaml_aliases_share_like_pyyaml(doc: Any) -> None:
    shared = {"a": doc, "b": doc, "c": [doc, doc]}  # safe_dump writes anchors and aliases
    text = yaml.safe_dump(shared)
    assert safeio.parse_yaml(text, "t.yaml") == yaml.safe_load(text)


@SETTINGS
@given(documents)
def test_json_reads_like_json(doc: Any) -> None:
    text = json.dumps(doc)
    assert safeio.parse_json(text, "t.json") == json.loads(text)


HOSTILE: st.SearchStrategy[Any] = st.sampled_from(
    [math.nan, math.inf, -math.inf, 1e308, -1e308, -1.0, -1e-9, 0, 10**30, True, None, "x", [], {}]
)


def _paths(doc: Any) -> list[list[Any]]:
    out: list[list[Any]] = []
    stack: list[tuple[Any, list[Any]]] = [(doc, [])]
    while stack:
        x, p = stack.pop()
        if p:
            out.append(p)
        if isinstance(x, dict):
            stack.extend((v, [*p, k]) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, [*p, i]) for i, v in enumerate(x))
    return out


def _replace(doc: Any, path: list[Any], value: Any) -> Any:
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


BOOKINFO = None


def _bookinfo() -> Any:
    global BOOKINFO
    if BOOKINFO is None:
        from importlib import resources

        text = resources.files("meshtax").joinpath("data/examples/bookinfo.yaml").read_text()
        BOOKINFO = safeio.parse_yaml(text, "bookinfo.yaml")
    return json.loads(json.dumps(BOOKINFO))


def _check_prediction(ecgs: Any, prof: Profile) -> None:
    bp = predict_batch(to_batch(ecgs), lambda name: prof)
    names: tuple[str, ...] = ("latency_overhead_us", "latency_lo_us", "latency_hi_us")
    names += ("cpu_vcpu", "cpu_lo_vcpu", "cpu_hi_vcpu")
    for name in names:
        a = np.asarray(getattr(bp, name), dtype=float)
        assert np.isfinite(a).all(), name
        assert (a >= -1e-6 * np.maximum(1.0, np.abs(a).max())).all(), (name, a)
    for lo, mid, hi in (
        (bp.latency_lo_us, bp.latency_overhead_us, bp.latency_hi_us),
        (bp.cpu_lo_vcpu, bp.cpu_vcpu, bp.cpu_hi_vcpu),
    ):
        tol = 1e-9 * np.maximum(1.0, np.abs(mid))
        assert (lo <= mid + tol).all() and (mid <= hi + tol).all(), (lo, mid, hi)


def _profile_doc() -> dict[str, Any]:
    from tests.fuzz.corpus import _profile_seed

    return dict(json.loads(_profile_seed().data))


@pytest.fixture(scope="module")
def profile_doc() -> dict[str, Any]:
    return _profile_doc()


@SETTINGS
@given(st.data(), HOSTILE)
def test_any_value_in_a_profile_is_refused_or_predicts_sanely(
    data: st.DataObject, value: Any
) -> None:
    doc = _profile_doc()
    path = data.draw(st.sampled_from(_paths(doc)))
    _replace(doc, path, value)
    try:
        prof = Profile.from_dict(json.loads(json.dumps(doc)), source="p.json")
        ecgs = ecgs_from_dict(_bookinfo(), "bookinfo.yaml")
        _check_prediction(ecgs, prof)  # may refuse cleanly: e.g. a mode the profile lacks
    except MeshtaxError:
        return


@SETTINGS
@given(st.data(), HOSTILE)
def test_any_value_in_an_ecg_is_refused_or_predicts_sanely(data: st.DataObject, value: Any) -> None:
    doc = _bookinfo()
    path = data.draw(st.sampled_from(_paths(doc)))
    _replace(doc, path, value)
    try:
        ecgs = ecgs_from_dict(doc, "bookinfo.yaml")
        _check_prediction(ecgs, reference_profile())
    except MeshtaxError:
        return


@SETTINGS
@given(st.dictionaries(st.sampled_from(["all", "ipc", "filters", "x"]), leaves | HOSTILE))
def test_any_speedup_factor_is_refused_or_finite(scale: dict[str, Any]) -> None:
    try:
        sp = speedup_from_dict({"name": "s", "scale": scale}, "s.yaml")
        after, _ = apply_speedup(reference_profile(), sp)
    except MeshtaxError:
        return
    assert all(math.isfinite(x) and x >= 0 for f in sp.factors.values() for x in (f.latency, f.cpu))
    _check_prediction(ecgs_from_dict(_bookinfo(), "bookinfo.yaml"), after)
