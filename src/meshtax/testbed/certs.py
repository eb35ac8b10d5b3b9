"""Sidecar-to-sidecar mTLS: a CA, SPIFFE workload certificates, and Envoy TLS contexts.

Certificates are made with the ``cryptography`` package, Istio-style: one CA per trust domain
and per-workload certificates whose only identity is a URI SAN
``spiffe://<trust domain>/ns/<namespace>/sa/<service account>``, valid for both client and
server auth. The client sidecar's outbound cluster presents its certificate and checks the
server's SPIFFE ID; the server sidecar's inbound listener requires a client certificate from
the CA whose SAN is in the trust domain.

PEMs are put inline in the bootstrap: a proxy running as an unprivileged UID needs no access
to files of ours (throwaway keys; they are visible in the process's argv).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig

__all__ = [
    "TLS_VERSIONS",
    "CertAuthority",
    "Credential",
    "KeyType",
    "TlsVersion",
    "downstream_tls",
    "sidecar_mtls",
    "spiffe_id",
    "upstream_tls",
]

KeyType = Literal["rsa2048", "ecdsa-p256"]
TlsVersion = Literal["1.2", "1.3"]
TLS_VERSIONS: tuple[TlsVersion, ...] = ("1.3", "1.2")
TRUST_DOMAIN = "cluster.local"
T = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."

_PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def spiffe_id(name: str, namespace: str = "default", trust_domain: str = TRUST_DOMAIN) -> str:
    """``spiffe://cluster.local/ns/default/sa/NAME``, the identity Istio gives a workload."""
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{name}"


def _new_key(kind: KeyType) -> _PrivateKey:
    if kind == "rsa2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if kind == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    raise ValueError(f"key type {kind!r}: use rsa2048 or ecdsa-p256")


def _key_pem(key: _PrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _now(now: dt.datetime | None) -> dt.datetime:
    return now or dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Credential:
    """A workload's certificate and private key (PEM), and the identity in its SAN."""

    cert_pem: str
    key_pem: str
    spiffe_id: str

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem.encode())

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """``stem.crt`` and ``stem.key`` (0600) in ``directory``, e.g. for ``ssl``/openssl."""
        directory.mkdir(parents=True, exist_ok=True)
        crt, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        crt.write_text(self.cert_pem)
        key.touch(mode=0o600)
        key.write_text(self.key_pem)
        return crt, key


@dataclass(frozen=True)
class CertAuthority:
    """A self-signed root for one trust domain that issues workload certificates."""

    cert_pem: str
    key_pem: str
    trust_domain: str = TRUST_DOMAIN
    key_type: KeyType = "rsa2048"

    @classmethod
    def generate(
        cls,
        trust_domain: str = TRUST_DOMAIN,
        *,
        key_type: KeyType = "rsa2048",
        valid_days: int = 365,
        now: dt.datetime | None = None,
    ) -> CertAuthority:
        """A fresh CA; RSA 2048 by default, as Istio's workload certificates are."""
        key = _new_key(key_type)
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain),
                x509.NameAttribute(NameOID.COMMON_NAME, f"meshtax root CA ({trust_domain})"),
            ]
        )
        start = _now(now) - dt.timedelta(minutes=5)  # tolerate small clock skew
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(
            cert.public_bytes(serialization.Encoding.PEM).decode(),
            _key_pem(key),
            trust_domain,
            key_type,
        )

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem.encode())

    def issue(
        self,
        name: str,
        namespace: str = "default",
        *,
        valid_hours: float = 24.0,
        identity: str | None = None,
        now: dt.datetime | None = None,
    ) -> Credential:
        """A workload certificate for service account ``name`` (Istio's default life is 24 h).

        ``identity`` overrides the URI SAN (tests use it for identities outside the domain).
        """
        ca_key = serialization.load_pem_private_key(self.key_pem.encode(), password=None)
        if not isinstance(ca_key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
            raise TypeError("CA key must be RSA or EC")
        key = _new_key(self.key_type)
        uri = identity or spiffe_id(name, namespace, self.trust_domain)
        start = _now(now) - dt.timedelta(minutes=5)
        ca_cert = self.cert
        cert = (
            x509.CertificateBuilder()
            # Istio leaves the subject empty; a name makes logs readable and changes nothing
            .subject_name(
                x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, self.trust_domain)])
            )
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + dt.timedelta(hours=valid_hours))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=isinstance(key, rsa.RSAPrivateKey),
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=True
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        return Credential(
            cert.public_bytes(serialization.Encoding.PEM).decode(), _key_pem(key), uri
        )


# ---- Envoy TLS contexts ----------------------------------------------------------------------


def _tls_params(version: TlsVersion) -> dict[str, str]:
    if version not in TLS_VERSIONS:
        raise ValueError(f"TLS version {version!r}: use 1.2 or 1.3")
    v = "TLSv1_3" if version == "1.3" else "TLSv1_2"
    # pinned at both ends: a profile of "TLS 1.2" must not negotiate 1.3
    return {"tls_minimum_protocol_version": v, "tls_maximum_protocol_version": v}


def _common(
    cred: Credential, ca_pem: str, version: TlsVersion, san: Mapping[str, str], alpn: Sequence[str]
) -> dict[str, Any]:
    common: dict[str, Any] = {
        "tls_params": _tls_params(version),
        "tls_certificates": [
            {
                "certificate_chain": {"inline_string": cred.cert_pem},
                "private_key": {"inline_string": cred.key_pem},
            }
        ],
        "validation_context": {
            "trusted_ca": {"inline_string": ca_pem},
            "match_typed_subject_alt_names": [{"san_type": "URI", "matcher": dict(san)}],
        },
    }
    if alpn:
        common["alpn_protocols"] = list(alpn)
    return common


def downstream_tls(
    cred: Credential,
    ca_pem: str,
    *,
    version: TlsVersion = "1.3",
    trust_domain: str = TRUST_DOMAIN,
    alpn: Sequence[str] = (),
) -> dict[str, Any]:
    """The inbound listener's ``transport_socket``: present ``cred``, require a client
    certificate from the CA whose URI SAN is in ``trust_domain``."""
    ctx = {
        "@type": T + "DownstreamTlsContext",
        "common_tls_context": _common(
            cred, ca_pem, version, {"prefix": f"spiffe://{trust_domain}/"}, alpn
        ),
        "require_client_certificate": True,
    }
    return {"name": "envoy.transport_sockets.tls", "typed_config": ctx}


def upstream_tls(
    cred: Credential,
    ca_pem: str,
    server_id: str,
    *,
    version: TlsVersion = "1.3",
    alpn: Sequence[str] = (),
) -> dict[str, Any]:
    """The outbound cluster's ``transport_socket``: present ``cred`` and accept only a server
    whose certificate is from the CA and carries exactly ``server_id``."""
    ctx = {
        "@type": T + "UpstreamTlsContext",
        "common_tls_context": _common(cred, ca_pem, version, {"exact": server_id}, alpn),
    }
    return {"name": "envoy.transport_sockets.tls", "typed_config": ctx}


def _alpn(mode: Mode) -> tuple[str, ...]:
    # gRPC rides HTTP/2, negotiated in the handshake; TCP mode carries opaque bytes
    return {Mode.GRPC: ("h2",), Mode.HTTP: ("http/1.1",), Mode.TCP: ()}[mode]


def sidecar_mtls(
    cfg: EnvoyConfig,
    ca: CertAuthority,
    cred: Credential,
    *,
    peer_id: str | None = None,
    version: TlsVersion = "1.3",
) -> EnvoyConfig:
    """``cfg`` with mTLS on both sides of the mesh hop: its inbound listener terminates mTLS
    (server side) and its outbound cluster originates it (client side), both as ``cred``.

    ``peer_id``: the SPIFFE ID the outbound side demands of the server sidecar; by default
    ``cred``'s own, for a profile whose client and server sidecars share one identity.
    """
    alpn = _alpn(cfg.mode)
    server = peer_id or cred.spiffe_id
    return dataclasses.replace(
        cfg,
        inbound_tls=downstream_tls(
            cred, ca.cert_pem, version=version, trust_domain=ca.trust_domain, alpn=alpn
        ),
        outbound_tls=upstream_tls(cred, ca.cert_pem, server, version=version, alpn=alpn),
    )
