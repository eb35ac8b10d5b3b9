"""mTLS on the sidecar-to-sidecar hop, measured on loopback: a sidecar pair (client sidecar →
server sidecar → echo) in one Envoy, plaintext and mTLS side by side, compared through the one
paired-run loop.

* Per message: worker CPU and latency per request with mTLS minus plaintext over sizes,
  divided by 4 crossings (each sidecar encrypts or decrypts the request and the response) →
  the ``tls`` component, fitted with a split at the TLS record size (16 KiB).
* Per connection: TCP-mode connections opened one after another (connect, one echoed line,
  close), mTLS minus plaintext, halved per sidecar → the handshake model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.backends import Backends
from meshtax.profile.filters import FilterRunOptions
from meshtax.profile.large import n_for
from meshtax.profile.loopback import VariantEnvoy, variant_envoy
from meshtax.testbed.certs import CertAuthority, sidecar_mtls
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.variants import LO, Variant, variant
from meshtax.testbed.paired import Paired, PairPolicy, paired_runs
from meshtax.testbed.pods import Testbed

__all__ = [
    "TLS_RECORD",
    "TLS_SIZES",
    "HandshakeResult",
    "TlsResult",
    "measure_handshake",
    "measure_tls",
    "tls_models",
]

TLS_SIZES = (100, 4096, 16384, 65536)
TLS_RECORD = 16384


@dataclass(frozen=True)
class TlsResult:
    """Per request through the sidecar pair, mTLS minus plaintext, per size (µs)."""

    mode: Mode
    version: str
    sizes: tuple[int, ...]
    cpu_us: Mapping[int, Estimate]
    latency_us: Mapping[int, Estimate]
    plain_cpu_us: Mapping[int, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "tls_version": self.version,
            "sizes": list(self.sizes),
            "cpu_us_per_request_pair": {str(s): e.to_dict() for s, e in self.cpu_us.items()},
            "latency_us_per_request_pair": {
                str(s): e.to_dict() for s, e in self.latency_us.items()
            },
            "plain_cpu_us_per_request_pair": {str(s): v for s, v in self.plain_cpu_us.items()},
        }


def _pair_variants(
    mode: Mode, ports: Sequence[int], echo: tuple[str, int], version: str
) -> list[Variant]:
    """plain_out → plain_in → echo and mtls_out ─mTLS→ mtls_in → echo, in one Envoy."""
    ca = CertAuthority.generate()
    s_cred, c_cred = ca.issue("server"), ca.issue("client")
    v: Any = version
    srv = sidecar_mtls(EnvoyConfig(mode=mode), ca, s_cred, version=v)
    cli = sidecar_mtls(EnvoyConfig(mode=mode), ca, c_cred, peer_id=s_cred.spiffe_id, version=v)
    return [
        variant("plain_out", mode, ports[0], (LO, ports[1])),
        variant("plain_in", mode, ports[1], echo),
        variant("mtls_out", mode, ports[2], (LO, ports[3]), cluster_tls=cli.outbound_tls),
        variant("mtls_in", mode, ports[3], echo, listener_tls=srv.inbound_tls),
    ]


def measure_tls(
    tb: Testbed,
    be: Backends,
    mode: Mode,
    sizes: Sequence[int],
    opts: FilterRunOptions,
    version: str = "1.3",
    progress: Callable[[str], None] | None = None,
) -> TlsResult:
    """Per-request cost of mTLS on the sidecar-to-sidecar hop, per size."""
    cpu: dict[int, Estimate] = {}
    lat: dict[int, Estimate] = {}
    plain: dict[int, float] = {}

    def build(ports: Sequence[int], echo: tuple[str, int], _out: Any) -> list[Variant]:
        return _pair_variants(mode, ports, echo, version)

    with variant_envoy(tb, be, mode, build, 4, label=f"tls-{mode.value}") as ve:
        for size in sizes:
            n = n_for(size, opts.n)
            for v in ("plain_out", "mtls_out"):
                ve.load(ve.target(v), mode, size, max(n // 4, 20))
            paired = _mtls_vs_plain(ve, size, n, opts.rounds, progress)
            pairs = paired.pairs("mtls_out", "plain_out")
            cpu[size] = estimate([m[0] - p[0] for m, p in pairs])
            lat[size] = estimate([m[1] - p[1] for m, p in pairs])
            plain[size] = median([p[0] for _, p in pairs])
    return TlsResult(mode, version, tuple(sizes), cpu, lat, plain)


def _mtls_vs_plain(
    ve: VariantEnvoy, size: int, n: int, rounds: int, progress: Callable[[str], None] | None
) -> Paired[tuple[float, float]]:
    return paired_runs(
        [("mtls_out", "plain_out")],
        lambda name: ve.run(name, size, n),
        PairPolicy.fixed(rounds),
        progress=progress,
    )


def tls_models(r: TlsResult) -> ComponentModel:
    """The ``tls`` component per crossing: per-request pair differences / 4, every round a sample."""
    sizes: list[float] = []
    cpu: list[float] = []
    lat: list[float] = []
    for s in r.sizes:
        for c, lt in zip(r.cpu_us[s].samples, r.latency_us[s].samples):
            sizes.append(s)
            cpu.append(c / 4)
            lat.append(lt / 4)
    split = TLS_RECORD if max(r.sizes) > TLS_RECORD else None
    note = (
        f"TLS {r.version} mTLS minus plaintext on a sidecar pair, per request / 4 crossings; "
        "split at the TLS record size"
    )
    return ComponentModel(
        CostModel.fit(sizes, lat, split_bytes=split, note=note + " (latency)"),
        CostModel.fit(sizes, cpu, split_bytes=split, note=note + " (worker CPU)"),
    )


@dataclass(frozen=True)
class HandshakeResult:
    """Per new connection through the pair (TCP mode), mTLS minus plaintext (µs)."""

    version: str
    connections: int
    cpu_us: Estimate
    latency_us: Estimate

    def model(self) -> ComponentModel:
        """Per sidecar: the pair's cost halved (each side does one half of the handshake)."""
        note = (
            f"TLS {self.version} handshake, mTLS minus plaintext per TCP connection through "
            "a sidecar pair, halved per sidecar"
        )
        lat = CostModel.fit(
            [0.0] * len(self.latency_us.samples),
            [x / 2 for x in self.latency_us.samples],
            note=note,
        )
        cpu = CostModel.fit(
            [0.0] * len(self.cpu_us.samples), [x / 2 for x in self.cpu_us.samples], note=note
        )
        return ComponentModel(lat, cpu)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tls_version": self.version,
            "connections_per_round": self.connections,
            "cpu_us_per_connection_pair": self.cpu_us.to_dict(),
            "latency_us_per_connection_pair": self.latency_us.to_dict(),
        }


ConnectFn = Callable[[int, int], float]  # (port, k connections) → mean seconds per connection


def measure_handshake(
    tb: Testbed,
    be: Backends,
    opts: FilterRunOptions,
    version: str = "1.3",
    k: int = 200,
) -> HandshakeResult:
    """TCP mode: worker CPU and time per new connection, mTLS minus plaintext, paired rounds."""

    def build(ports: Sequence[int], echo: tuple[str, int], _out: Any) -> list[Variant]:
        return _pair_variants(Mode.TCP, ports, echo, version)

    with variant_envoy(tb, be, Mode.TCP, build, 4, label="handshake") as ve:
        for v in ("plain_out", "mtls_out"):
            ve.connect(v, 20)  # warm: first connections pay for lazy set-up
        paired = paired_runs(
            [("mtls_out", "plain_out")],
            lambda name: ve.connect(name, k),
            PairPolicy.fixed(opts.rounds),
        )
    pairs = paired.pairs("mtls_out", "plain_out")
    return HandshakeResult(
        version,
        k,
        estimate([m[0] - p[0] for m, p in pairs]),
        estimate([m[1] - p[1] for m, p in pairs]),
    )
