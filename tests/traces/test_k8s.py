"""Kubernetes/Istio manifests → one SidecarConfig per Service, following Istio's rules; clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig
from meshtax.traces.ecg_file import ecgs_from_dict, parse_sidecar
from meshtax.traces.k8s import (
    ConfigImportError,
    resolve_sidecar_refs,
    resolve_sidecar_refs_with_report,
    sidecars_from_k8s,
)

FIX = Path(__file__).parent / "fixtures"
SHOP = FIX / "k8s" / "shop"

SHOP_EXPECTED = {
    "frontend": SidecarConfig(
        Mode.HTTP, ("rate_limit", "lua"), mtls=True
    ),  # mesh EnvoyFilter first, then the namespace's
    "cart": SidecarConfig(Mode.HTTP, ("rate_limit",), mtls=True),  # unnamed port: assumed http
    "checkout": SidecarConfig(
        Mode.GRPC, ("rate_limit", "wasm"), mtls=True
    ),  # jwt_authn has no profile
    "payments": SidecarConfig(
        Mode.GRPC, ("rate_limit",), mtls=False
    ),  # appProtocol wins; port-level DISABLE
    "search": SidecarConfig(Mode.GRPC, ("rbac_http_2", "rate_limit"), mtls=True),  # INSERT_FIRST
    "redis": NO_SIDECAR,  # inject: "false" label
    "inventory": SidecarConfig(
        Mode.TCP, (), mtls=True
    ),  # pod label in an unlabelled namespace; mesh STRICT
    "reports": NO_SIDECAR,  # unlabelled namespace, no pod label
    "worker": NO_SIDECAR,  # istio-injection=disabled beats the pod label
}


def test_shop_manifests_map_to_exact_sidecars() -> None:
    imp = sidecars_from_k8s(SHOP)
    assert imp.services == SHOP_EXPECTED
    assert imp.unknown_filters == ("envoy.filters.http.jwt_authn (EnvoyFilter shop/checkout-auth)",)
    assert imp.problems == []


@pytest.mark.parametrize(
    "assumption",
    [
        "service 'cart' port 7070 has no name/appProtocol: Istio sniffs the protocol; assumed http",
        "service 'checkout' has ports 5050 (grpc), 9102 (http): modelled by its first port, 5050",
        "service 'inventory': EnvoyFilter istio-system/local-ratelimit patch 0 adds an HTTP filter, "
        "but the port is TCP: does not apply",
        "service 'frontend': PERMISSIVE (namespace PeerAuthentication shop/default): sidecar "
        "callers use auto mTLS: modelled mTLS",
        "not read (no effect on the modelled sidecar): ConfigMap ×1",
    ],
)
def test_shop_reports_its_assumptions(assumption: str) -> None:
    assert any(a.startswith(assumption) for a in sidecars_from_k8s(SHOP).assumptions), assumption


def test_services_yaml_pastes_into_an_ecg() -> None:
    imp = sidecars_from_k8s(SHOP)
    text = imp.to_ecg_services_yaml()
    assert (
        "  search: {sidecar: {mode: grpc, filters: [rbac_http_2, rate_limit], mtls: true}}" in text
    )
    assert "  redis: {sidecar: none}" in text
    assert "# no profile for filter envoy.filters.http.jwt_authn" in text
    doc = yaml.safe_load(text)
    doc["invocations"] = [{"id": "a", "callee": "frontend", "duration_us": 100}]
    (ecg,) = ecgs_from_dict(doc, "pasted.yaml")  # valid against the ECG schema and semantics
    assert {n: s.sidecar for n, s in ecg.services.items()} == SHOP_EXPECTED
    assert {
        n: parse_sidecar(v["sidecar"], SidecarConfig()) for n, v in doc["services"].items()
    } == SHOP_EXPECTED


# --- small manifests, one rule at a time ------------------------------------------------------


def _ns(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _app(
    name: str,
    ns: str = "default",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    port: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    meta = {"labels": {"app": name, **(labels or {})}, "annotations": annotations or {}}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "template": {
                    "metadata": meta,
                    "spec": {
                        "containers": [
                            {
                                "name": name,
                                "image": "x",
                                "ports": [{"containerPort": 8080, "name": "web"}],
                            }
                        ]
                    },
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "selector": {"app": name},
                "ports": [port or {"name": "http", "port": 80, "targetPort": 8080}],
            },
        },
    ]


def _pa(
    name: str,
    ns: str,
    mode: str,
    selector: dict[str, str] | None = None,
    ports: dict[int, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"mtls": {"mode": mode}}
    if selector:
        spec["selector"] = {"matchLabels": selector}
    if ports:
        spec["portLevelMtls"] = {p: {"mode": m} for p, m in ports.items()}
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def _write(tmp_path: Path, docs: list[dict[str, Any]]) -> Path:
    (tmp_path / "m.yaml").write_text(yaml.safe_dump_all(docs))
    return tmp_path


@pytest.mark.parametrize(
    ("ns_labels", "pod_labels", "pod_annotations", "injected"),
    [
        ({"istio-injection": "enabled"}, {}, {}, True),
        ({"istio-injection": "enabled"}, {"sidecar.istio.io/inject": "false"}, {}, False),
        ({"istio-injection": "enabled"}, {}, {"sidecar.istio.io/inject": "false"}, False),
        ({"istio-injection": "disabled"}, {"sidecar.istio.io/inject": "true"}, {}, False),
        ({"istio.io/rev": "1-22"}, {}, {}, True),
        ({}, {"sidecar.istio.io/inject": "true"}, {}, True),
        ({}, {"istio.io/rev": "canary"}, {}, True),
        ({}, {}, {"sidecar.istio.io/inject": "true"}, False),  # the webhook selects on the label
        ({}, {}, {}, False),
    ],
)
def test_injection_rules(
    tmp_path: Path,
    ns_labels: dict[str, str],
    pod_labels: dict[str, str],
    pod_annotations: dict[str, str],
    injected: bool,
) -> None:
    imp = sidecars_from_k8s(
        _write(
            tmp_path,
            [
                _ns("default", **ns_labels),
                *_app("a", labels=pod_labels, annotations=pod_annotations),
            ],
        )
    )
    assert imp.services["a"].meshed is injected


@pytest.mark.parametrize(
    ("port", "mode"),
    [
        ({"name": "http", "port": 80}, Mode.HTTP),
        ({"name": "http-api", "port": 80}, Mode.HTTP),
        ({"name": "http2-api", "port": 80}, Mode.GRPC),
        ({"name": "grpc", "port": 80}, Mode.GRPC),
        ({"name": "grpc-web-ui", "port": 80}, Mode.GRPC),
        ({"name": "tcp-db", "port": 80}, Mode.TCP),
        ({"name": "https", "port": 443}, Mode.TCP),
        ({"name": "tls-x", "port": 443}, Mode.TCP),
        ({"name": "mongo", "port": 27017}, Mode.TCP),
        ({"name": "http-web", "appProtocol": "grpc", "port": 80}, Mode.GRPC),  # appProtocol wins
        ({"name": "grpc", "appProtocol": "http", "port": 80}, Mode.HTTP),
        ({"appProtocol": "kubernetes.io/h2c", "port": 80}, Mode.GRPC),
        ({"port": 80}, Mode.HTTP),  # unnamed: assumed, and said so
        ({"name": "web", "port": 80}, Mode.TCP),  # not a protocol Istio knows
    ],
)
def test_protocol_selection(tmp_path: Path, port: dict[str, Any], mode: Mode) -> None:
    imp = sidecars_from_k8s(
        _write(tmp_path, [_ns("default", **{"istio-injection": "enabled"}), *_app("a", port=port)])
    )
    assert imp.services["a"].mode is mode


def test_udp_port_has_no_sidecar_and_is_a_problem(tmp_path: Path) -> None:
    imp = sidecars_from_k8s(
        _write(
            tmp_path,
            [
                _ns("default", **{"istio-injection": "enabled"}),
                *_app("a", port={"name": "dns", "port": 53, "protocol": "UDP"}),
            ],
        )
    )
    assert imp.services["a"] == NO_SIDECAR
    assert any("UDP" in p for p in imp.problems)


@pytest.mark.parametrize(
    ("pas", "mtls"),
    [
        ([], True),  # Istio default PERMISSIVE + auto mTLS
        ([_pa("default", "istio-system", "DISABLE")], False),
        (
            [_pa("default", "istio-system", "DISABLE"), _pa("default", "default", "STRICT")],
            True,
        ),  # namespace over mesh
        (
            [_pa("default", "default", "STRICT"), _pa("a", "default", "DISABLE", {"app": "a"})],
            False,
        ),  # workload over namespace
        (
            [_pa("default", "default", "DISABLE"), _pa("a", "default", "UNSET", {"app": "a"})],
            False,
        ),  # UNSET inherits
        (
            [_pa("a", "default", "STRICT", {"app": "a"}, {8080: "DISABLE"})],
            False,
        ),  # port level, on the target port
        (
            [_pa("a", "default", "DISABLE", {"app": "a"}, {9999: "STRICT"})],
            False,
        ),  # another port's setting
        ([_pa("a", "default", "DISABLE", {"app": "other"})], True),  # selects another workload
        ([_pa("default", "other-ns", "DISABLE")], True),  # another namespace
    ],
)
def test_peer_authentication_precedence(
    tmp_path: Path, pas: list[dict[str, Any]], mtls: bool
) -> None:
    imp = sidecars_from_k8s(
        _write(tmp_path, [_ns("default", **{"istio-injection": "enabled"}), *_app("a"), *pas])
    )
    assert imp.services["a"].mtls is mtls


def _ef(
    name: str, ns: str, patches: list[dict[str, Any]], selector: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"configPatches": patches}
    if selector:
        spec["workloadSelector"] = {"labels": selector}
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def _patch(
    op: str,
    value: dict[str, Any] | None = None,
    sub: str = "envoy.filters.http.router",
    context: str = "SIDECAR_INBOUND",
    apply_to: str = "HTTP_FILTER",
) -> dict[str, Any]:
    p: dict[str, Any] = {"operation": op}
    if value is not None:
        p["value"] = value
    return {
        "applyTo": apply_to,
        "match": {
            "context": context,
            "listener": {
                "filterChain": {
                    "filter": {
                        "name": "envoy.filters.network.http_connection_manager",
                        "subFilter": {"name": sub},
                    }
                }
            },
        },
        "patch": p,
    }


LUA = {
    "name": "envoy.filters.http.lua",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"},
}
TAP = {
    "name": "envoy.filters.http.tap",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.tap.v3.Tap"},
}
HM = {
    "name": "envoy.filters.http.header_mutation",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
    },
}


@pytest.mark.parametrize(
    ("efs", "filters"),
    [
        (
            [_ef("x", "default", [_patch("INSERT_BEFORE", LUA), _patch("INSERT_BEFORE", TAP)])],
            ("lua", "tap"),
        ),
        (
            [_ef("x", "default", [_patch("INSERT_BEFORE", LUA), _patch("INSERT_FIRST", TAP)])],
            ("tap", "lua"),
        ),
        (
            [
                _ef(
                    "x",
                    "default",
                    [
                        _patch("INSERT_BEFORE", LUA),
                        _patch("INSERT_BEFORE", TAP),
                        _patch("INSERT_AFTER", HM, sub="envoy.filters.http.lua"),
                    ],
                )
            ],
            ("lua", "header_mutation", "tap"),
        ),
        (
            [
                _ef(
                    "x",
                    "default",
                    [
                        _patch("INSERT_BEFORE", LUA),
                        _patch("INSERT_BEFORE", TAP, sub="envoy.filters.http.lua"),
                    ],
                )
            ],
            ("tap", "lua"),
        ),
        (
            [
                _ef(
                    "x",
                    "default",
                    [_patch("INSERT_BEFORE", LUA), _patch("REMOVE", sub="envoy.filters.http.lua")],
                )
            ],
            (),
        ),
        ([_ef("x", "default", [_patch("INSERT_BEFORE", LUA, context="GATEWAY")])], ()),
        ([_ef("x", "default", [_patch("INSERT_BEFORE", LUA)], selector={"app": "other"})], ()),
        ([_ef("x", "elsewhere", [_patch("INSERT_BEFORE", LUA)])], ()),
        ([_ef("x", "istio-system", [_patch("INSERT_BEFORE", LUA)])], ("lua",)),
        # the workload's namespace comes after the root namespace, whatever the file order
        (
            [
                _ef("x", "default", [_patch("INSERT_BEFORE", TAP)]),
                _ef("y", "istio-system", [_patch("INSERT_BEFORE", LUA)]),
            ],
            ("lua", "tap"),
        ),
    ],
)
def test_envoy_filter_patches(
    tmp_path: Path, efs: list[dict[str, Any]], filters: tuple[str, ...]
) -> None:
    imp = sidecars_from_k8s(
        _write(tmp_path, [_ns("default", **{"istio-injection": "enabled"}), *_app("a"), *efs])
    )
    assert imp.services["a"].filters == filters


def test_outbound_only_and_merge_patches_are_assumptions(tmp_path: Path) -> None:
    efs = [
        _ef(
            "x",
            "default",
            [
                _patch("INSERT_BEFORE", LUA, context="SIDECAR_OUTBOUND"),
                _patch("MERGE", {"typed_config": {}}, sub="envoy.filters.http.lua"),
            ],
        )
    ]
    imp = sidecars_from_k8s(
        _write(tmp_path, [_ns("default", **{"istio-injection": "enabled"}), *_app("a"), *efs])
    )
    assert imp.services["a"].filters == ("lua",)
    text = "\n".join(imp.assumptions)
    assert "SIDECAR_OUTBOUND only" in text and "MERGEs envoy.filters.http.lua" in text


def test_same_name_in_two_namespaces(tmp_path: Path) -> None:
    docs = [
        _ns("a", **{"istio-injection": "enabled"}),
        _ns("b"),
        *_app("web", ns="a"),
        *_app("web", ns="b"),
    ]
    imp = sidecars_from_k8s(_write(tmp_path, docs))
    assert imp.services == {"web.a": SidecarConfig(Mode.HTTP, (), mtls=True), "web.b": NO_SIDECAR}


def test_service_without_workload_or_selector_is_a_problem(tmp_path: Path) -> None:
    svc = _app("a")[1]
    bare = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "ext"},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }
    imp = sidecars_from_k8s(
        _write(tmp_path, [_ns("default", **{"istio-injection": "enabled"}), svc, bare])
    )
    assert imp.services == {}
    assert [p.split(" ")[1] for p in imp.problems] == ["'a'", "'ext'"]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("k8s/bad_yaml", "manifests.yaml (document 2): line 8 column 7: YAML syntax error"),
        (
            "k8s/wrong_types",
            "svc.yaml (document 2): Service 'cart': spec.ports: a str; expected a list",
        ),
        ("k8s/not_k8s", "values.yaml: no 'kind'; expected a Kubernetes object"),
        ("k8s/missing", "missing: not found; expected a directory"),
        (
            "envoy",
            "bootstrap_grpc_mtls.json: no 'kind'; expected a Kubernetes object",
        ),  # an Envoy config is not a manifest
    ],
)
def test_errors_name_file_and_document(where: str, message: str) -> None:
    with pytest.raises(ConfigImportError) as ei:
        sidecars_from_k8s(FIX / where)
    assert message in str(ei.value)


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigImportError, match="no \\*.yaml, \\*.yml or \\*.json file"):
        sidecars_from_k8s(tmp_path)


def test_bad_peer_authentication_mode(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigImportError,
        match="PeerAuthentication 'p': spec.mtls.mode 'ON'; expected STRICT, PERMISSIVE, DISABLE or UNSET",
    ):
        sidecars_from_k8s(_write(tmp_path, [_pa("p", "default", "ON")]))


# --- ECG references --------------------------------------------------------------------------


def test_ecg_references_resolve(tmp_path: Path) -> None:
    doc = {
        "sidecars_from_k8s": str(SHOP),
        "services": {
            "frontend": {},
            "cart": {"sidecar": "tcp"},  # explicit: kept
            "edge": {"sidecar": {"from_envoy": str(FIX / "envoy" / "bootstrap_grpc_mtls.json")}},
            "mesh": {
                "sidecar": {
                    "from_envoy": str(FIX / "envoy" / "istio_config_dump.json"),
                    "port": 9090,
                }
            },
            "unknown": {},
        },
        "invocations": [{"id": "r", "callee": "frontend", "duration_us": 100}],
    }
    with pytest.raises(ConfigImportError, match="outside the ECG file's directory"):
        resolve_sidecar_refs_with_report(doc, tmp_path)
    out, messages = resolve_sidecar_refs_with_report(doc, tmp_path, [FIX])
    assert "sidecars_from_k8s" not in out and "sidecars_from_k8s" in doc  # input untouched
    (ecg,) = ecgs_from_dict(out, "refs.yaml")
    got = {n: s.sidecar for n, s in ecg.services.items()}
    assert got == {
        "frontend": SHOP_EXPECTED["frontend"],
        "cart": SidecarConfig(Mode.TCP),
        "edge": SidecarConfig(
            Mode.GRPC,
            ("fault_injection", "rbac_http_3", "ip_tagging_2", "header_mutation"),
            mtls=True,
        ),
        "mesh": SidecarConfig(Mode.TCP, (), mtls=True),
        "unknown": SidecarConfig(),
    }
    assert any("no Service 'unknown' in the manifests" in m for m in messages)
    assert any("no profile for filter envoy.filters.http.jwt_authn" in m for m in messages)
    assert resolve_sidecar_refs(doc, tmp_path, [FIX]) == out


@pytest.mark.parametrize(
    ("sidecar", "message"),
    [
        ({"from_envoy": 3}, "services.a.sidecar.from_envoy: a int; expected a file path"),
        ({"from_envoy": "x.yaml", "mode": "http"}, "unknown field(s) mode next to from_envoy"),
        (
            {"from_envoy": "x.yaml", "port": "80"},
            "services.a.sidecar.port: '80'; expected a port number",
        ),
        ({"from_envoy": "x.yaml"}, "x.yaml: file not found"),
    ],
)
def test_ecg_reference_errors(tmp_path: Path, sidecar: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigImportError) as ei:
        resolve_sidecar_refs({"services": {"a": {"sidecar": sidecar}}}, tmp_path)
    assert message in str(ei.value)


def test_wrong_types_anywhere_give_import_errors_not_tracebacks(tmp_path: Path) -> None:
    from tests.traces.test_envoy_config import mutations

    docs = [d for f in sorted(SHOP.rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    for d in mutations(docs, 300, seed=11):
        # a JSON `kind: List`: the same objects, parsed fast
        (tmp_path / "m.json").write_text(
            json.dumps({"apiVersion": "v1", "kind": "List", "items": d})
        )
        try:
            sidecars_from_k8s(tmp_path)
        except ConfigImportError:
            pass
