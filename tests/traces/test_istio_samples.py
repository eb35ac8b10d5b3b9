"""`config from-k8s` on Istio's own public manifests (fixtures/istio, see its README): each
service's resulting sidecar, with the RBAC filters, mTLS and telemetry Istio would give it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshtax.model.components import OTHER, filter_component
from meshtax.model.ecg import to_batch
from meshtax.model.presets import ISTIO_DEFAULT
from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.traces.ecg_file import ecgs_from_dict
from meshtax.traces.k8s import sidecars_from_k8s
from tests.helpers import flat, profile

ISTIO = Path(__file__).parent / "fixtures" / "istio"
BOOKINFO = ("details", "ratings", "reviews", "productpage")
TEL = ISTIO_DEFAULT


def _tree(tmp_path: Path, *files: Path, extra: list[dict[str, Any]] | None = None) -> Path:
    for f in files:
        shutil.copy(f, tmp_path / f.name)
    if extra:
        (tmp_path / "extra.yaml").write_text(yaml.safe_dump_all(extra))
    return tmp_path


def _ns(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _in_namespace(src: Path, ns: str, dst: Path) -> Path:
    """``src``'s objects placed in namespace ``ns`` (as ``kubectl apply -n ns`` would)."""
    docs = [d for d in yaml.safe_load_all(src.read_text()) if d]
    for d in docs:
        d["metadata"]["namespace"] = ns
    out = dst / f"{ns}-{src.name}"
    out.write_text(yaml.safe_dump_all(docs))
    return out


def test_bookinfo_as_published_warns_that_nothing_is_injected() -> None:
    imp = sidecars_from_k8s(ISTIO / "bookinfo")
    assert imp.services == {s: NO_SIDECAR for s in BOOKINFO}
    (problem,) = imp.problems
    assert "no Namespace manifest for default" in problem and "--injection enabled" in problem


def test_bookinfo_with_injection_enabled_gets_istio_defaults() -> None:
    imp = sidecars_from_k8s(ISTIO / "bookinfo", injection="enabled")
    assert imp.services == {s: SidecarConfig(Mode.HTTP, (TEL,), mtls=True) for s in BOOKINFO}
    assert imp.problems == []
    for s in BOOKINFO:
        assert imp.details[s] == [
            "mTLS: yes, PERMISSIVE (no PeerAuthentication (Istio's default))",
            "telemetry: istio-default (Istio's default; Lua stand-ins for metadata exchange "
            "and stats)",
        ]
    assert sidecars_from_k8s(ISTIO / "bookinfo", injection="disabled").services == {
        s: NO_SIDECAR for s in BOOKINFO
    }


def test_bookinfo_with_its_policies(tmp_path: Path) -> None:
    """The done criterion of #21: RBAC with rule counts, mTLS and telemetry per service."""
    d = _tree(
        tmp_path, ISTIO / "bookinfo" / "bookinfo.yaml", ISTIO / "policies/bookinfo-authz.yaml"
    )
    imp = sidecars_from_k8s(d, injection="enabled")
    # allow-nothing (namespace-wide, no rules) joins each service's own ALLOW policy in one
    # RBAC filter; ratings-viewer has 2 sources × 2 operations
    rules = {"details": 1, "ratings": 4, "reviews": 1, "productpage": 1}
    assert imp.services == {
        s: SidecarConfig(Mode.HTTP, (TEL, f"rbac_http_{n}"), mtls=True) for s, n in rules.items()
    }
    assert imp.details["ratings"] == [
        "mTLS: yes, STRICT (mesh PeerAuthentication istio-system/default)",
        "telemetry: istio-default (Istio's default; Lua stand-ins for metadata exchange and stats)",
        "RBAC ALLOW: 4 rule(s) (default/allow-nothing, default/ratings-viewer) → rbac_http_4",
    ]
    report = imp.report()
    assert "ratings      http +istio-default+rbac_http_4 mTLS" in report
    assert "RBAC ALLOW: 1 rule(s) (default/allow-nothing, default/productpage-viewer)" in report
    assert report.endswith(
        "predict needs these filters in the profile: meshtax profile --filters "
        "istio-default,rbac_http_1,rbac_http_4 --modes http --mtls"
    )
    text = imp.to_ecg_services_yaml()
    assert "  # RBAC ALLOW: 4 rule(s)" in text
    assert (
        "  ratings: {sidecar: {mode: http, filters: [istio-default, rbac_http_4], mtls: true}}"
        in text
    )


def test_bookinfo_with_its_policies_is_priced(tmp_path: Path) -> None:
    """The imported services paste into an ECG and `predict` prices every filter: each
    request to productpage crosses its sidecar twice (request, response)."""
    d = _tree(
        tmp_path, ISTIO / "bookinfo" / "bookinfo.yaml", ISTIO / "policies/bookinfo-authz.yaml"
    )
    doc = yaml.safe_load(sidecars_from_k8s(d, injection="enabled").to_ecg_services_yaml())
    doc["invocations"] = [{"id": "r", "callee": "productpage", "duration_us": 1000}]
    costs = {"istio_metadata_exchange": 3.0, "istio_stats": 5.0, "rbac_http_1": 7.0}
    comps = {OTHER: flat(10, 1)} | {filter_component(f): flat(c, c) for f, c in costs.items()}
    prof = profile({Mode.HTTP: comps})
    (ecg,) = ecgs_from_dict(doc, "bookinfo.yaml")
    bp = predict_batch(to_batch([ecg]), single_profile(prof))
    assert bp.latency_overhead_us[0] == pytest.approx(2 * (10 + 3 + 5 + 7))
    assert any("mTLS" in w for w in bp.warnings)  # the test profile has no TLS model


def test_httpbin_and_sleep() -> None:
    for d, name in ((ISTIO / "httpbin", "httpbin"), (ISTIO / "sleep", "sleep")):
        imp = sidecars_from_k8s(d, injection="enabled")
        assert imp.services == {name: SidecarConfig(Mode.HTTP, (TEL,), mtls=True)}


def test_istio_authz_builder_inputs_give_istios_policy_counts(tmp_path: Path) -> None:
    """Istio's RBAC-builder test inputs, on httpbin in namespace foo: its expected outputs have
    9 ALLOW policies (multiple-policies) and a DENY then an ALLOW filter (deny-and-allow)."""
    httpbin = _in_namespace(ISTIO / "httpbin" / "httpbin.yaml", "foo", tmp_path)
    for policy, chain in (
        ("multiple-policies-in.yaml", (TEL, "rbac_http_9")),
        ("deny-and-allow-in.yaml", (TEL, "rbac_http_1", "rbac_http_1")),
    ):
        d = tmp_path / policy.removesuffix(".yaml")
        d.mkdir()
        _tree(
            d,
            httpbin,
            ISTIO / "authz" / policy,
            extra=[_ns("foo", **{"istio-injection": "enabled"})],
        )
        imp = sidecars_from_k8s(d)
        assert imp.services == {"httpbin": SidecarConfig(Mode.HTTP, chain, mtls=True)}, policy
    assert imp.details["httpbin"][-2:] == [
        "RBAC DENY: 1 rule(s) (foo/httpbin-deny) → rbac_http_1",
        "RBAC ALLOW: 1 rule(s) (foo/httpbin-allow) → rbac_http_1",
    ]


def _policy(kind: str, name: str, spec: dict[str, Any], ns: str = "default") -> dict[str, Any]:
    api = "telemetry.istio.io/v1" if kind == "Telemetry" else "security.istio.io/v1"
    if kind == "Sidecar":
        api = "networking.istio.io/v1"
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("objects", "expected", "unknown"),
    [
        # metrics off mesh-wide: Istio drops its stats filter, keeps metadata exchange
        (
            [
                _policy(
                    "Telemetry",
                    "mesh-default",
                    {
                        "metrics": [
                            {
                                "providers": [{"name": "prometheus"}],
                                "overrides": [{"disabled": True}],
                            }
                        ]
                    },
                    ns="istio-system",
                )
            ],
            SidecarConfig(Mode.HTTP, ("istio_metadata_exchange",), mtls=True),
            (),
        ),
        # access logging on for the namespace: the access log, last
        (
            [_policy("Telemetry", "logs", {"accessLogging": [{"providers": [{"name": "envoy"}]}]})],
            SidecarConfig(Mode.HTTP, (TEL, "access_log"), mtls=True),
            (),
        ),
        # a workload Telemetry overrides the mesh one
        (
            [
                _policy(
                    "Telemetry",
                    "off",
                    {"metrics": [{"overrides": [{"disabled": True}]}]},
                    ns="istio-system",
                ),
                _policy(
                    "Telemetry",
                    "on",
                    {
                        "selector": {"matchLabels": {"app": "productpage"}},
                        "metrics": [{"providers": [{"name": "prometheus"}]}],
                    },
                ),
            ],
            SidecarConfig(Mode.HTTP, (TEL,), mtls=True),
            (),
        ),
        # JWT: no profile, listed
        (
            [
                _policy(
                    "RequestAuthentication",
                    "jwt",
                    {
                        "selector": {"matchLabels": {"app": "productpage"}},
                        "jwtRules": [{"issuer": "a"}],
                    },
                )
            ],
            SidecarConfig(Mode.HTTP, (TEL,), mtls=True),
            ("envoy.filters.http.jwt_authn (RequestAuthentication default/jwt, 1 JWT rule(s))",),
        ),
        # CUSTOM: Istio's RBAC filter deciding when to call ext_authz, which has no profile
        (
            [
                _policy(
                    "AuthorizationPolicy",
                    "ext",
                    {
                        "action": "CUSTOM",
                        "provider": {"name": "opa"},
                        "rules": [
                            {
                                "to": [
                                    {"operation": {"paths": ["/admin"]}},
                                    {"operation": {"paths": ["/x"]}},
                                ]
                            }
                        ],
                    },
                )
            ],
            SidecarConfig(Mode.HTTP, (TEL, "rbac_http_2"), mtls=True),
            ("envoy.filters.http.ext_authz (CUSTOM provider opa; default/ext)",),
        ),
        # a mesh-wide DENY policy with a selector reaches the workload in its namespace
        (
            [
                _policy(
                    "AuthorizationPolicy",
                    "deny",
                    {
                        "selector": {"matchLabels": {"app": "productpage"}},
                        "action": "DENY",
                        "rules": [{}, {}, {}],
                    },
                    ns="istio-system",
                )
            ],
            SidecarConfig(Mode.HTTP, (TEL, "rbac_http_3"), mtls=True),
            (),
        ),
        # a policy of another namespace does not
        (
            [_policy("AuthorizationPolicy", "x", {"rules": [{}]}, ns="other")],
            SidecarConfig(Mode.HTTP, (TEL,), mtls=True),
            (),
        ),
        # a Sidecar declaring the inbound port gRPC
        (
            [
                _policy(
                    "Sidecar",
                    "grpc",
                    {
                        "workloadSelector": {"labels": {"app": "productpage"}},
                        "ingress": [{"port": {"number": 9080, "protocol": "GRPC", "name": "grpc"}}],
                    },
                )
            ],
            SidecarConfig(Mode.GRPC, (TEL,), mtls=True),
            (),
        ),
    ],
    ids=[
        "metrics-off",
        "access-log",
        "workload-telemetry",
        "jwt",
        "custom",
        "mesh-deny",
        "other-ns",
        "sidecar-grpc",
    ],
)
def test_policy_resources_on_productpage(
    tmp_path: Path, objects: list[dict[str, Any]], expected: SidecarConfig, unknown: tuple[str, ...]
) -> None:
    d = _tree(tmp_path, ISTIO / "bookinfo" / "bookinfo.yaml", extra=objects)
    imp = sidecars_from_k8s(d, injection="enabled")
    assert imp.services["productpage"] == expected
    assert imp.unknown_filters == unknown


def test_authorization_on_a_tcp_port_is_network_rbac(tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all((ISTIO / "bookinfo" / "bookinfo.yaml").read_text()) if d]
    for d in docs:
        if d["kind"] == "Service" and d["metadata"]["name"] == "ratings":
            d["spec"]["ports"][0]["name"] = "tcp"
    (tmp_path / "bookinfo.yaml").write_text(yaml.safe_dump_all(docs))
    pol = _policy(
        "AuthorizationPolicy", "r", {"rules": [{"from": [{"source": {"namespaces": ["a"]}}]}]}
    )
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pol))
    imp = sidecars_from_k8s(tmp_path, injection="enabled")
    assert imp.services["ratings"] == SidecarConfig(Mode.TCP, ("rbac_network_1",), mtls=True)
    assert "per connection: not modelled" in imp.details["ratings"][1]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"action": "LOG"}, "spec.action 'LOG'; expected one of ALLOW, DENY, AUDIT, CUSTOM"),
        ({"rules": ["x"]}, r"spec.rules\[0\]: a str; expected \{from, to, when\}"),
    ],
)
def test_bad_policies_are_clear_errors(tmp_path: Path, spec: dict[str, Any], message: str) -> None:
    from meshtax.traces.config_files import ConfigImportError

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(_policy("AuthorizationPolicy", "bad", spec)))
    with pytest.raises(ConfigImportError, match=message):
        sidecars_from_k8s(tmp_path)


def test_unknown_injection_is_refused() -> None:
    with pytest.raises(ValueError, match="injection 'maybe'"):
        sidecars_from_k8s(ISTIO / "bookinfo", injection="maybe")


def test_an_ecg_references_bookinfo_with_injection(tmp_path: Path) -> None:
    from meshtax.traces.config_files import ConfigImportError
    from meshtax.traces.k8s import resolve_sidecar_refs

    shutil.copytree(ISTIO / "bookinfo", tmp_path / "bookinfo")
    doc = {
        "sidecars_from_k8s": {"path": "bookinfo", "injection": "enabled"},
        "services": {"productpage": {}},
        "invocations": [{"id": "r", "callee": "productpage", "duration_us": 1000}],
    }
    (ecg,) = ecgs_from_dict(resolve_sidecar_refs(doc, tmp_path), "g.yaml")
    assert ecg.services["productpage"].sidecar == SidecarConfig(
        Mode.HTTP, ("istio_metadata_exchange", "istio_stats"), mtls=True
    )
    doc["sidecars_from_k8s"] = {"path": "bookinfo", "injection": "often"}
    with pytest.raises(ConfigImportError, match="injection: 'often'; expected one of labels"):
        resolve_sidecar_refs(doc, tmp_path)


def test_bookinfo_destination_rules_set_what_clients_send(tmp_path: Path) -> None:
    """Istio's networking sample: every Bookinfo host ISTIO_MUTUAL; a DISABLE rule turns a
    PERMISSIVE service's hops plaintext, and against STRICT it is a problem (requests fail)."""
    d = _tree(
        tmp_path,
        ISTIO / "bookinfo" / "bookinfo.yaml",
        ISTIO / "networking" / "destination-rule-all-mtls.yaml",
    )
    imp = sidecars_from_k8s(d, injection="enabled")
    assert all(c.mtls for c in imp.services.values())
    assert imp.details["reviews"][0] == (
        "mTLS: yes, PERMISSIVE (no PeerAuthentication (Istio's default)); "
        "clients: ISTIO_MUTUAL (DestinationRule default/reviews)"
    )
    plain = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "all-plain", "namespace": "default"},
        "spec": {
            "host": "*.default.svc.cluster.local",
            "trafficPolicy": {"tls": {"mode": "DISABLE"}},
        },
    }
    (d / "extra.yaml").write_text(yaml.safe_dump(plain))
    imp = sidecars_from_k8s(d, injection="enabled")
    # the exact hosts win over the wildcard
    assert all(c.mtls for c in imp.services.values())
    (d / "destination-rule-all-mtls.yaml").unlink()
    imp = sidecars_from_k8s(d, injection="enabled")
    assert not any(c.mtls for c in imp.services.values())
    shutil.copy(ISTIO / "policies" / "bookinfo-authz.yaml", d)  # mesh-wide STRICT
    imp = sidecars_from_k8s(d, injection="enabled")
    assert len(imp.problems) == 4 and "plaintext to a STRICT server" in imp.problems[0]


def test_a_virtual_service_fault_prices_the_fault_filter(tmp_path: Path) -> None:
    """Istio's networking sample: a 7 s delay for one user on routes to ratings. The fault
    filter's evaluation runs on every call to ratings; the delay itself is not an overhead."""
    d = _tree(
        tmp_path,
        ISTIO / "bookinfo" / "bookinfo.yaml",
        ISTIO / "networking" / "virtual-service-ratings-test-delay.yaml",
    )
    imp = sidecars_from_k8s(d, injection="enabled")
    assert imp.services["ratings"].filters == (TEL, "fault_injection")
    assert imp.services["reviews"].filters == (TEL,)
    assert "fault filter configured by VirtualService default/ratings" in imp.details["ratings"]
    assert any("delays and aborts change the application" in a for a in imp.assumptions)
    # bound to a gateway only: not on the sidecars
    doc = yaml.safe_load((d / "virtual-service-ratings-test-delay.yaml").read_text())
    doc["spec"]["gateways"] = ["bookinfo-gateway"]
    (d / "virtual-service-ratings-test-delay.yaml").write_text(yaml.safe_dump(doc))
    imp = sidecars_from_k8s(d, injection="enabled")
    assert imp.services["ratings"].filters == (TEL,)
