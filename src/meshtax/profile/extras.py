"""What ``meshtax profile --filters/--mtls/--memory/--large`` adds to a base profile.

* **filters** (:mod:`meshtax.profile.filterprof`): one ``filter:NAME`` component per
  catalogue filter and mode, by difference against the base sidecar. Filters that run once
  per connection (network RBAC) also get a per-connection model in TCP and HTTP mode (one
  message per new connection, with minus without) → ``ModeProfile.per_connection``.
* **mTLS**: a sidecar pair (client sidecar → server sidecar → echo) in one Envoy, plaintext
  and mTLS side by side. Per message: worker CPU and latency per request with mTLS minus
  plaintext over sizes, divided by 4 crossings (each of the two sidecars encrypts or decrypts
  the request and the response) → the ``tls`` component, fitted with a split at the TLS record
  size (16 KiB). Per connection: TCP-mode connections opened one after another (connect, one
  echoed line, close), mTLS minus plaintext, halved per sidecar → ``ModeProfile.tls_handshake``.
  Every version in ``tls_versions`` (1.3 and 1.2) is measured into ``ModeProfile.tls_by_version``;
  the primary ``tls_version`` also fills ``tls``/``tls_handshake`` (``ModeProfile.tls_version``).
* **memory** (:mod:`meshtax.profile.memory`): the server sidecar's RSS against its open
  connections, plaintext and mTLS → ``ModeProfile.memory``/``memory_mtls``.
* **large messages**: the base sidecar at sizes up to 1 MiB; a straight line through the small
  sizes underestimates large messages, so the split size (:func:`meshtax.profile.fit.choose_split`)
  and the cost of each extra unit are fitted and added to the mode's ``other`` component (its
  intercept and slope stay as profiled).

The extended profile is a copy of the base, saved as ``<base>+extras`` unless named (replacing
an earlier extended profile of that name, whose measurements it keeps unless re-measured).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from meshtax import __version__
from meshtax.model.components import OTHER, TLS, filter_component
from meshtax.model.costmodel import ComponentModel, CostModel, extra_units
from meshtax.model.profile import ModeProfile, Profile, Provenance, TlsModels
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.filterprof import (
    BASE,
    LO,
    FilterBackends,
    FilterRunOptions,
    ModeRun,
    MultiEnvoy,
    Variant,
    additivity,
    combos_for,
    differences,
    echo_server,
    filter_models,
    free_ports,
    measure_connections,
    multi_bootstrap,
    profile_filters,
    real_load,
    resolve_filters,
    variant,
)
from meshtax.profile.filterprof import ConnectFn as ModeConnectFn
from meshtax.profile.filterprof import connect_loop as mode_connect_loop
from meshtax.profile.fit import choose_split
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.system import System

__all__ = [
    "LARGE_SIZES",
    "ExtrasOptions",
    "ExtrasBackends",
    "HandshakeResult",
    "LargeResult",
    "ProfileStoreLike",
    "TlsResult",
    "add_large",
    "fit_large",
    "measure_handshake",
    "measure_large",
    "measure_tls",
    "profile_extras",
    "tls_models",
]

LARGE_SIZES = (100, 1024, 4096, 16384, 65536, 262144, 1048576)
LARGE_CHECK = (16384, 65536, 262144, 1048576)
TLS_SIZES = (100, 4096, 16384, 65536)
TLS_RECORD = 16384
SPLIT_CANDIDATES = (16384, 32768, 65536, 131072)
# components that run once per connection (their per-message cost is ~0 on reused connections)
PER_CONNECTION_PREFIX = "rbac_network_"
CONNECT_MODES = (Mode.TCP, Mode.HTTP, Mode.GRPC)  # what the connection loop speaks
SMALL_MAX = 4096  # sizes that fit one unit whatever the split: the "paper's line" is fitted on them


@dataclass(frozen=True)
class ExtrasOptions:
    """What to add: ``filters`` (``"all"``, a list of filters/components, or None), ``mtls``,
    ``memory``, ``large``; ``modes`` default to the base profile's modes; ``name`` of the
    saved profile defaults to ``<base>+extras``."""

    filters: str | tuple[str, ...] | None = None
    quick: bool = False
    mtls: bool = False
    memory: bool = False
    large: bool = False
    modes: tuple[Mode | str, ...] | None = None
    name: str | None = None
    tls_version: str = "1.3"  # the version of the top-level ``tls``/``tls_handshake`` and of memory
    tls_versions: tuple[str, ...] = ("1.3", "1.2")  # every version measured (``tls_by_version``)

    def to_dict(self) -> dict[str, Any]:
        return {
            "filters": self.filters
            if self.filters is None or isinstance(self.filters, str)
            else list(self.filters),
            "quick": self.quick,
            "mtls": self.mtls,
            "memory": self.memory,
            "large": self.large,
            "modes": None if self.modes is None else [Mode(m).value for m in self.modes],
            "tls_version": self.tls_version,
            "tls_versions": list(self.tls_versions),
        }


class ProfileStoreLike(Protocol):
    def get(self, name: str) -> Profile: ...

    def save(self, profile: Profile, *, replace: bool = False) -> None: ...


# ---- measurements in one multi-listener Envoy ---------------------------------------------


def _rounds(
    env: MultiEnvoy,
    be: FilterBackends,
    pairs: Sequence[tuple[Variant, Variant]],
    mode: Mode,
    size: int,
    n: int,
    rounds: int,
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Paired runs (a, b) per round, order alternating: CPU and latency per request of each."""
    assert be.load is not None
    ca, cb, la, lb = [], [], [], []
    for r in range(rounds):
        for a, b in pairs:
            got = {}
            for v in (a, b) if r % 2 == 0 else (b, a):
                c0 = be.cpu_ns(env.pid)
                res = be.load(f"{LO}:{v.port}", mode, size, n)
                got[v.name] = ((be.cpu_ns(env.pid) - c0) / 1e3 / res.count, res.avg_us)
            ca.append(got[a.name][0])
            la.append(got[a.name][1])
            cb.append(got[b.name][0])
            lb.append(got[b.name][1])
    return ca, la, cb, lb


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
    from meshtax.testbed.certs import CertAuthority, sidecar_mtls

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
    mode: Mode,
    sizes: Sequence[int],
    opts: FilterRunOptions,
    system: System,
    be: FilterBackends,
    work: Path,
    version: str = "1.3",
) -> TlsResult:
    """Per-request cost of mTLS on the sidecar-to-sidecar hop, per size."""
    ports = (be.free_ports or free_ports)(6)
    variants = _pair_variants(mode, ports[2:], (LO, ports[0]), version)
    boot = multi_bootstrap(variants, ports[1])
    cpu: dict[int, Estimate] = {}
    lat: dict[int, Estimate] = {}
    plain: dict[int, float] = {}
    with (
        _echo(be, system, work / "echo-tls", mode, ports[0]),
        be.envoy(system, boot, work / f"tls-{mode.value}") as env,
    ):
        for size in sizes:
            n = _n_for(size, opts.n)
            for v in (variants[0], variants[2]):
                assert be.load is not None
                be.load(f"{LO}:{v.port}", mode, size, max(n // 4, 20))
            cm, lm, cp, lp = _rounds(
                env, be, [(variants[2], variants[0])], mode, size, n, opts.rounds
            )
            cpu[size] = estimate([a - b for a, b in zip(cm, cp)])
            lat[size] = estimate([a - b for a, b in zip(lm, lp)])
            plain[size] = median(cp)
    return TlsResult(mode, version, tuple(sizes), cpu, lat, plain)


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
    note = f"TLS {r.version} mTLS minus plaintext on a sidecar pair, per request / 4 crossings; split at the TLS record size"
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
        note = f"TLS {self.version} handshake, mTLS minus plaintext per TCP connection through a sidecar pair, halved per sidecar"
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


def connect_loop(port: int, k: int) -> float:
    """Open ``k`` connections one after another: connect, send a line, read it back, close."""
    return mode_connect_loop(port, k, Mode.TCP)


def measure_handshake(
    opts: FilterRunOptions,
    system: System,
    be: FilterBackends,
    work: Path,
    version: str = "1.3",
    connect: ConnectFn = connect_loop,
    k: int = 200,
) -> HandshakeResult:
    """TCP mode: worker CPU and time per new connection, mTLS minus plaintext, paired rounds."""
    ports = (be.free_ports or free_ports)(6)
    variants = _pair_variants(Mode.TCP, ports[2:], (LO, ports[0]), version)
    boot = multi_bootstrap(variants, ports[1])
    dc: list[float] = []
    dl: list[float] = []
    with (
        _echo(be, system, work / "echo-hs", Mode.TCP, ports[0]),
        be.envoy(system, boot, work / "handshake") as env,
    ):
        for v in (variants[0], variants[2]):
            connect(v.port, 20)  # warm: first connections pay for lazy set-up
        for r in range(opts.rounds):
            got = {}
            for v in (variants[2], variants[0]) if r % 2 == 0 else (variants[0], variants[2]):
                c0 = be.cpu_ns(env.pid)
                t = connect(v.port, k)
                got[v.name] = ((be.cpu_ns(env.pid) - c0) / 1e3 / k, t * 1e6)
            dc.append(got["mtls_out"][0] - got["plain_out"][0])
            dl.append(got["mtls_out"][1] - got["plain_out"][1])
    return HandshakeResult(version, k, estimate(dc), estimate(dl))


# ---- large messages ----------------------------------------------------------------------


def _n_for(size: int, n: int) -> int:
    # about 50 MB per run at most: 1 MiB echoes take milliseconds each
    return max(20, min(n, (50 << 20) // max(size, 1)))


@dataclass(frozen=True)
class LargeResult:
    """Per request through the base sidecar (µs): worker CPU and mean latency, rounds per size."""

    mode: Mode
    cpu_us: Mapping[int, tuple[float, ...]]
    latency_us: Mapping[int, tuple[float, ...]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "cpu_us_per_request": {str(s): list(v) for s, v in self.cpu_us.items()},
            "latency_us_per_request": {str(s): list(v) for s, v in self.latency_us.items()},
        }


def measure_large(
    mode: Mode,
    sizes: Sequence[int],
    opts: FilterRunOptions,
    system: System,
    be: FilterBackends,
    work: Path,
) -> LargeResult:
    ports = (be.free_ports or free_ports)(3)
    v = variant(BASE, mode, ports[2], (LO, ports[0]))
    boot = multi_bootstrap([v], ports[1])
    cpu: dict[int, list[float]] = {s: [] for s in sizes}
    lat: dict[int, list[float]] = {s: [] for s in sizes}
    assert be.load is not None
    with (
        _echo(be, system, work / "echo-large", mode, ports[0]),
        be.envoy(system, boot, work / f"large-{mode.value}") as env,
    ):
        for s in sizes:
            be.load(f"{LO}:{v.port}", mode, s, max(_n_for(s, opts.n) // 4, 10))
        for _ in range(opts.rounds):
            for s in sizes:
                c0 = be.cpu_ns(env.pid)
                res = be.load(f"{LO}:{v.port}", mode, s, _n_for(s, opts.n))
                cpu[s].append((be.cpu_ns(env.pid) - c0) / 1e3 / res.count)
                lat[s].append(res.avg_us)
    return LargeResult(
        mode, {s: tuple(x) for s, x in cpu.items()}, {s: tuple(x) for s, x in lat.items()}
    )


@dataclass(frozen=True)
class LargeFit:
    """The small-size line (the paper's model), the split model, and both against measurement."""

    metric: str
    line: CostModel
    split: CostModel
    measured: Mapping[int, float]  # per crossing (per request halved), medians

    def rows(self, sizes: Sequence[int] = LARGE_CHECK) -> list[dict[str, float]]:
        out = []
        for s in sizes:
            if s not in self.measured:
                continue
            m = self.measured[s]
            lp, sp = float(self.line.predict([s])[0]), float(self.split.predict([s])[0])
            out.append(
                {
                    "size": s,
                    "measured": m,
                    "line": lp,
                    "line_error": (lp - m) / m if m else float("nan"),
                    "split_model": sp,
                    "split_error": (sp - m) / m if m else float("nan"),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "line": self.line.to_dict(),
            "split": self.split.to_dict(),
            "measured_per_crossing": {str(s): v for s, v in self.measured.items()},
            "check": self.rows(),
        }


def fit_large(sizes_values: Mapping[int, Sequence[float]], metric: str) -> LargeFit:
    """Per crossing (values halved): the line through sizes ≤ 4 KiB, and the best split model
    over all sizes (``choose_split`` over 16/32/64/128 KiB; a line if no split helps)."""
    s: list[float] = []
    y: list[float] = []
    for size, vs in sorted(sizes_values.items()):
        s += [float(size)] * len(vs)
        y += [v / 2 for v in vs]
    small = [(a, b) for a, b in zip(s, y) if a <= SMALL_MAX]
    line = CostModel.fit(
        [a for a, _ in small],
        [b for _, b in small],
        note=f"{metric}: line through sizes <= {SMALL_MAX} B",
    )
    split = choose_split(s, y, SPLIT_CANDIDATES)
    model = CostModel.fit(s, y, split_bytes=split, note=f"{metric}: all sizes, split {split}")
    med = {size: median(vs) / 2 for size, vs in sizes_values.items()}
    return LargeFit(metric, line, model, med)


def add_large(mp: ModeProfile, cpu: LargeFit, lat: LargeFit) -> ModeProfile:
    """``mp`` with the large-message cost (split size and per extra unit, fitted on what the
    small-size line misses) added to its ``other`` component; everything else unchanged."""
    comps = dict(mp.components)
    base = comps.get(OTHER, ComponentModel())

    def extra(model: CostModel, fit: LargeFit) -> CostModel:
        if fit.split.split_bytes is None:
            return model
        # what the small-size line misses, per extra unit: fitted through the origin
        xs = np.asarray(fit.split.samples.sizes if fit.split.samples else (), dtype=np.float64)
        ys = np.asarray(fit.split.samples.values if fit.split.samples else (), dtype=np.float64)
        xu = extra_units(xs, fit.split.split_bytes)
        resid = ys - fit.line.predict(xs)
        u = float(xu @ resid / (xu @ xu)) if float(xu @ xu) > 0 else 0.0
        note = (
            model.note
            + f"; + {u:.3g} per extra {fit.split.split_bytes}-byte unit (large-message fit)"
        ).lstrip("; ")
        return dataclasses.replace(
            model, split_bytes=fit.split.split_bytes, per_unit=model.per_unit + u, note=note
        )

    comps[OTHER] = ComponentModel(extra(base.latency, lat), extra(base.cpu, cpu))
    return dataclasses.replace(mp, components=comps)


# ---- the entry point ------------------------------------------------------------------------


@dataclass
class ExtrasBackends:
    """Injectable for tests: the filter backends and the memory/handshake measurements."""

    filters: FilterBackends = field(default_factory=FilterBackends)
    memory: Callable[[Mode, bool, bool, str, System], Any] | None = None  # → MemoryResult
    connect: ConnectFn = connect_loop
    connect_mode: ModeConnectFn = mode_connect_loop  # per-connection filter costs (TCP, HTTP, gRPC)
    now: Callable[[], _dt.datetime] = field(default=lambda: _dt.datetime.now(_dt.UTC))


def _echo(be: FilterBackends, system: System, work: Path, mode: Mode, port: int) -> Any:
    return (be.echo or echo_server)(system, work, mode, port)


def _real_memory(mode: Mode, mtls: bool, quick: bool, version: str, system: System) -> Any:
    from meshtax.profile.memory import CONNECTIONS, QUICK_CONNECTIONS, MemorySpec, measure_memory

    spec = MemorySpec(
        mode=mode,
        mtls=mtls,
        connections=QUICK_CONNECTIONS if quick else CONNECTIONS,
        tls_version=version,
    )
    return measure_memory(spec, system=system)


def profile_extras(
    options: ExtrasOptions,
    system: System,
    store: ProfileStoreLike,
    base_profile_name: str,
    progress: Callable[[str], None] | None = None,
    *,
    backends: ExtrasBackends | None = None,
) -> Profile:
    """Measure what ``options`` asks for, add it to a copy of the base profile, save, return it.

    Starts from the stored ``<name>`` if it exists (an earlier extras run of the same base),
    so ``--filters`` today and ``--mtls`` tomorrow end in one profile; re-measured parts replace
    the old ones. Raises ``ValueError`` if a requested mode is not in the base profile.
    """
    be = backends or ExtrasBackends()
    fb = be.filters
    large_fb = fb
    if fb.load is None:
        fb = dataclasses.replace(fb, load=real_load(system))
        large_fb = dataclasses.replace(fb, load=real_load(system, stdclient=True))
    say = progress or (lambda _m: None)
    base = store.get(base_profile_name)
    name = options.name or f"{base_profile_name}+extras"
    start = base
    try:
        prev = store.get(name)
        if prev.platform == base.platform and prev.name != base.name:
            start = prev
    except Exception:  # noqa: BLE001 — any store's "not found"
        pass
    modes = [Mode(m) for m in options.modes] if options.modes else list(base.modes)
    missing = [m.value for m in modes if m not in base.modes]
    if missing:
        raise ValueError(
            f"base profile {base_profile_name!r} has no {', '.join(missing)} mode; profile it first"
        )
    opts = FilterRunOptions.quick() if options.quick else FilterRunOptions()
    record: dict[str, Any] = (
        dict(start.provenance.options.get("extras", {})) if start is not base else {}
    )
    notes = list(start.provenance.notes)
    mps = {m: mp for m, mp in start.modes.items()}
    work = Path(tempfile.mkdtemp(prefix="meshtax-extras-"))
    try:
        if options.filters:
            per_mode = resolve_filters(options.filters, modes)
            rec: dict[str, Any] = {}
            for mode in modes:
                comps = per_mode[mode]
                if not comps:
                    continue
                say(f"filters, {mode.value} mode: {len(comps)} components")
                run = profile_filters(
                    mode,
                    comps,
                    opts,
                    system,
                    combos=combos_for(mode, comps),
                    backends=fb,
                    workdir=work / f"filters-{mode.value}",
                    progress=say,
                )
                models = filter_models(run)
                cs = dict(mps[mode].components)
                cs.update({filter_component(n): m for n, m in models.items()})
                mps[mode] = dataclasses.replace(mps[mode], components=cs)
                rec[mode.value] = _filters_record(run, combos_for(mode, comps))
                per_conn = [c for c in comps if c.startswith(PER_CONNECTION_PREFIX)]
                if per_conn and mode in CONNECT_MODES:
                    say(f"filters, {mode.value} mode: {len(per_conn)} per-connection components")
                    conns = measure_connections(
                        mode,
                        per_conn,
                        opts,
                        system,
                        backends=fb,
                        connect=be.connect_mode,
                        k=100 if options.quick else 300,
                        workdir=work / f"conn-{mode.value}",
                        progress=say,
                    )
                    pc = dict(mps[mode].per_connection)
                    pc.update({filter_component(n): m.model() for n, m in conns.items()})
                    mps[mode] = dataclasses.replace(mps[mode], per_connection=pc)
                    rec[mode.value]["per_connection"] = {n: m.to_dict() for n, m in conns.items()}
            record["filters"] = {**record.get("filters", {}), **rec}
        if options.mtls:
            rec = {}
            sizes: tuple[int, ...] = TLS_SIZES[:3] if options.quick else TLS_SIZES
            # the primary version first: it fills the top-level tls/tls_handshake
            for version in dict.fromkeys((options.tls_version, *options.tls_versions)):
                vrec: dict[str, Any] = {}
                say(f"mTLS {version}: handshake per connection (TCP)")
                hs = measure_handshake(
                    opts, system, fb, work, version, be.connect, k=100 if options.quick else 300
                )
                vrec["handshake"] = hs.to_dict()
                for mode in modes:
                    say(f"mTLS {version}: per message, {mode.value} mode")
                    r = measure_tls(mode, sizes, opts, system, fb, work, version)
                    vrec[mode.value] = r.to_dict()
                    per_msg = tls_models(r)
                    tv = {
                        **mps[mode].tls_by_version,
                        version: TlsModels(version, per_msg, hs.model()),
                    }
                    mps[mode] = dataclasses.replace(mps[mode], tls_by_version=tv)
                    if version == options.tls_version:
                        cs = dict(mps[mode].components)
                        cs[TLS] = per_msg
                        mps[mode] = dataclasses.replace(
                            mps[mode], components=cs, tls_handshake=hs.model(), tls_version=version
                        )
                rec[version] = vrec
            # the primary version's record also at the top, where earlier readers look
            record["mtls"] = {**rec.get(options.tls_version, {}), "by_version": rec}
        if options.memory:
            rec = {}
            for mode in modes:
                for mtls in (False, True):
                    say(f"memory: {mode.value}{' mTLS' if mtls else ''}")
                    res = (be.memory or _real_memory)(
                        mode, mtls, options.quick, options.tls_version, system
                    )
                    model = res.rss_models["server"]
                    key = "memory_mtls" if mtls else "memory"
                    mps[mode] = dataclasses.replace(mps[mode], **{key: model})
                    rec[f"{mode.value}{'+mtls' if mtls else ''}"] = res.to_dict()
            record["memory"] = rec
        if options.large:
            rec = {}
            sizes = LARGE_SIZES
            for mode in modes:
                say(f"large messages: {mode.value} mode, up to {max(sizes) >> 10} KiB")
                lr = measure_large(mode, sizes, opts, system, large_fb, work)
                cfit, lfit = fit_large(lr.cpu_us, "cpu"), fit_large(lr.latency_us, "latency")
                mps[mode] = add_large(mps[mode], cfit, lfit)
                rec[mode.value] = {
                    "measured": lr.to_dict(),
                    "cpu": cfit.to_dict(),
                    "latency": lfit.to_dict(),
                }
            record["large"] = rec
    finally:
        shutil.rmtree(work, ignore_errors=True)
    created = be.now().isoformat(timespec="seconds")
    what = [k for k in ("filters", "mtls", "memory", "large") if getattr(options, k)]
    notes.append(
        f"{created}: extras ({', '.join(what) or 'nothing'}) measured on loopback, added to base profile {base_profile_name!r}"
    )
    prov = Provenance(
        source="measured",
        by="meshtax profile --filters/--mtls/--memory/--large",
        created=created,
        tool_version=__version__,
        options={
            **start.provenance.options,
            "extras_base": base_profile_name,
            "extras_options": options.to_dict(),
            "extras": record,
        },
        notes=tuple(notes),
    )
    out = dataclasses.replace(start, name=name, provenance=prov, modes=mps)
    store.save(out, replace=True)
    return out


def _filters_record(run: ModeRun, combos: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    diffs = differences(run)
    return {
        "run": run.to_dict(),
        "filters": {str(s): {n: m.to_dict() for n, m in d.items()} for s, d in diffs.items()},
        "additivity": [r.to_dict() for r in additivity(run, combos)],
    }
