"""What ``meshtax profile --filters/--mtls/--memory/--large`` adds to a base profile.

* **filters** (:mod:`meshtax.profile.filters`): one ``filter:NAME`` component per
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
* **microarch** (:mod:`meshtax.profile.microarch`): instructions, cache misses and branch
  mispredictions per request of the base sidecar, each filter and chain, per mode, from the
  machine's counter source (hardware counters, else valgrind's simulators) → ``Profile.microarch``.
  With filters, its instruction counts also stand in for the filter profile's own callgrind pass.
* **large messages**: the base sidecar at sizes up to 1 MiB; a straight line through the small
  sizes underestimates large messages, so the split size (:func:`meshtax.profile.fit.choose_split`)
  and the cost of each extra unit are fitted and added to the mode's ``other`` component (its
  intercept and slope stay as profiled).

The extended profile is a copy of the base, saved as ``<base>+extras`` unless named (replacing
an earlier extended profile of that name, whose measurements it keeps unless re-measured).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from meshtax._version import __version__
from meshtax.model.components import TLS, filter_component
from meshtax.model.microarch import Microarch
from meshtax.model.profile import ModeProfile, Profile, Provenance, TlsModels
from meshtax.model.sidecar import Mode
from meshtax.profile.additivity import additivity
from meshtax.profile.backends import Backends
from meshtax.profile.connections import measure_connections
from meshtax.profile.filters import (
    FilterRunOptions,
    ModeRun,
    combos_for,
    differences,
    filter_models,
    profile_filters,
    resolve_filters,
)
from meshtax.profile.large import LARGE_SIZES, add_large, fit_large, measure_large
from meshtax.profile.memory import CONNECTIONS, QUICK_CONNECTIONS, MemorySpec, measure_memory
from meshtax.profile.microarch import (
    DEFAULT_FILTERS,
    MicroarchOptions,
    fill_instructions,
    measure_microarch,
)
from meshtax.profile.tls import TLS_SIZES, measure_handshake, measure_tls, tls_models
from meshtax.testbed.callgrind import load_symbol_map
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import System
from meshtax.testbed.tools import tool

__all__ = ["ExtrasOptions", "ProfileStoreLike", "profile_extras"]

# components that run once per connection (their per-message cost is ~0 on reused connections)
PER_CONNECTION_PREFIX = "rbac_network_"
CONNECT_MODES = (Mode.TCP, Mode.HTTP, Mode.GRPC)  # what the connection loop speaks
Modes = dict[Mode, ModeProfile]
Say = Callable[[str], None]


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
    microarch: bool = False
    counters: str = "auto"  # the microarch counter source: auto, valgrind or pmu
    symbol_map: str | None = None  # `nm -C` output of a stripped proxy binary (attribution)

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
            "microarch": self.microarch,
            "counters": self.counters,
            "symbol_map": self.symbol_map,
        }


class ProfileStoreLike(Protocol):
    def get(self, name: str) -> Profile: ...

    def save(self, profile: Profile, *, replace: bool = False) -> None: ...


def profile_extras(
    options: ExtrasOptions,
    system: System,
    store: ProfileStoreLike,
    base_profile_name: str,
    progress: Say | None = None,
    *,
    backends: Backends | None = None,
) -> Profile:
    """Measure what ``options`` asks for, add it to a copy of the base profile, save, return it.

    Starts from the stored ``<name>`` if it exists (an earlier extras run of the same base),
    so ``--filters`` today and ``--mtls`` tomorrow end in one profile; re-measured parts replace
    the old ones. Raises ``ValueError`` if a requested mode is not in the base profile. Every
    process and scratch directory lives in one testbed (reaped after a crash).
    """
    be = backends or Backends()
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
    record: dict[str, Any] = (
        dict(start.provenance.options.get("extras", {})) if start is not base else {}
    )
    mps: Modes = dict(start.modes)
    micro = start.microarch
    with be.testbed(system) as tb:
        counted = None
        if options.microarch:
            counted = _microarch(tb, be, options, modes, base, say)
            micro = counted if micro is None else micro.merged(counted)
        if options.filters:
            rec = _add_filters(tb, be, options, modes, mps, say, counted)
            record["filters"] = {**record.get("filters", {}), **rec}
        if options.mtls:
            record["mtls"] = _add_mtls(tb, be, options, modes, mps, say)
        if options.memory:
            record["memory"] = _add_memory(tb, be, options, modes, mps, say)
        if options.large:
            record["large"] = _add_large(tb, be, options, modes, mps, say)
    created = be.now().isoformat(timespec="seconds")
    what = [k for k in ("filters", "mtls", "memory", "large", "microarch") if getattr(options, k)]
    notes = [
        *start.provenance.notes,
        f"{created}: extras ({', '.join(what) or 'nothing'}) measured on loopback, "
        f"added to base profile {base_profile_name!r}",
    ]
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
    out = dataclasses.replace(start, name=name, provenance=prov, modes=mps, microarch=micro)
    store.save(out, replace=True)
    return out


def _run_options(options: ExtrasOptions) -> FilterRunOptions:
    return FilterRunOptions.quick() if options.quick else FilterRunOptions()


def _microarch(
    tb: Testbed, be: Backends, options: ExtrasOptions, modes: list[Mode], base: Profile, say: Say
) -> Microarch:
    source = be.counter_source(tb.system, options.counters)
    per_mode = resolve_filters(options.filters or list(DEFAULT_FILTERS), modes)
    return measure_microarch(
        tb,
        be,
        per_mode,
        source,
        MicroarchOptions.quick() if options.quick else MicroarchOptions(),
        binary=be.envoy_binary or tool("envoy"),
        symbols=None if options.symbol_map is None else load_symbol_map(options.symbol_map),
        measurements=base.provenance.options.get("measurements"),
        created=be.now().isoformat(timespec="seconds"),
        progress=lambda m: say(f"microarch, {m}"),
    )


def _add_filters(
    tb: Testbed,
    be: Backends,
    options: ExtrasOptions,
    modes: list[Mode],
    mps: Modes,
    say: Say,
    counted: Microarch | None = None,
) -> dict[str, Any]:
    opts = _run_options(options)
    if counted is not None:  # the microarch run counted instructions already
        opts = dataclasses.replace(opts, callgrind=False)
    per_mode = resolve_filters(options.filters, modes)
    rec: dict[str, Any] = {}
    for mode in modes:
        comps = per_mode[mode]
        if not comps:
            continue
        say(f"filters, {mode.value} mode: {len(comps)} components")
        combos = combos_for(mode, comps)
        run = profile_filters(tb, be, mode, comps, opts, combos=combos, progress=say)
        if counted is not None:
            fill_instructions(run, counted)
        cs = dict(mps[mode].components)
        cs.update({filter_component(n): m for n, m in filter_models(run).items()})
        mps[mode] = dataclasses.replace(mps[mode], components=cs)
        rec[mode.value] = _filters_record(run, combos)
        per_conn = [c for c in comps if c.startswith(PER_CONNECTION_PREFIX)]
        if per_conn and mode in CONNECT_MODES:
            say(f"filters, {mode.value} mode: {len(per_conn)} per-connection components")
            k = 100 if options.quick else 300
            conns = measure_connections(tb, be, mode, per_conn, opts.rounds, k=k, progress=say)
            pc = dict(mps[mode].per_connection)
            pc.update({filter_component(n): m.model() for n, m in conns.items()})
            mps[mode] = dataclasses.replace(mps[mode], per_connection=pc)
            rec[mode.value]["per_connection"] = {n: m.to_dict() for n, m in conns.items()}
    return rec


def _add_mtls(
    tb: Testbed, be: Backends, options: ExtrasOptions, modes: list[Mode], mps: Modes, say: Say
) -> dict[str, Any]:
    opts = _run_options(options)
    rec: dict[str, Any] = {}
    sizes: tuple[int, ...] = TLS_SIZES[:3] if options.quick else TLS_SIZES
    # the primary version first: it fills the top-level tls/tls_handshake
    for version in dict.fromkeys((options.tls_version, *options.tls_versions)):
        vrec: dict[str, Any] = {}
        say(f"mTLS {version}: handshake per connection (TCP)")
        hs = measure_handshake(tb, be, opts, version, k=100 if options.quick else 300)
        vrec["handshake"] = hs.to_dict()
        for mode in modes:
            say(f"mTLS {version}: per message, {mode.value} mode")
            r = measure_tls(tb, be, mode, sizes, opts, version)
            vrec[mode.value] = r.to_dict()
            per_msg = tls_models(r)
            tv = {**mps[mode].tls_by_version, version: TlsModels(version, per_msg, hs.model())}
            mps[mode] = dataclasses.replace(mps[mode], tls_by_version=tv)
            if version == options.tls_version:
                cs = {**mps[mode].components, TLS: per_msg}
                mps[mode] = dataclasses.replace(
                    mps[mode], components=cs, tls_handshake=hs.model(), tls_version=version
                )
        rec[version] = vrec
    # the primary version's record also at the top, where earlier readers look
    return {**rec.get(options.tls_version, {}), "by_version": rec}


def _add_memory(
    tb: Testbed, be: Backends, options: ExtrasOptions, modes: list[Mode], mps: Modes, say: Say
) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    conns = QUICK_CONNECTIONS if options.quick else CONNECTIONS
    for mode in modes:
        for mtls in (False, True):
            say(f"memory: {mode.value}{' mTLS' if mtls else ''}")
            spec = MemorySpec(mode, mtls, conns, options.tls_version)
            res = (be.memory or measure_memory)(tb, be, spec)
            model = res.rss_models["server"]
            mp = mps[mode]
            mps[mode] = (
                dataclasses.replace(mp, memory_mtls=model)
                if mtls
                else dataclasses.replace(mp, memory=model)
            )
            rec[f"{mode.value}{'+mtls' if mtls else ''}"] = res.to_dict()
    return rec


def _add_large(
    tb: Testbed, be: Backends, options: ExtrasOptions, modes: list[Mode], mps: Modes, say: Say
) -> dict[str, Any]:
    opts = _run_options(options)
    rec: dict[str, Any] = {}
    for mode in modes:
        say(f"large messages: {mode.value} mode, up to {max(LARGE_SIZES) >> 10} KiB")
        lr = measure_large(tb, be, mode, LARGE_SIZES, opts)
        cfit, lfit = fit_large(lr.cpu_us, "cpu"), fit_large(lr.latency_us, "latency")
        mps[mode] = add_large(mps[mode], cfit, lfit)
        rec[mode.value] = {
            "measured": lr.to_dict(),
            "cpu": cfit.to_dict(),
            "latency": lfit.to_dict(),
        }
    return rec


def _filters_record(run: ModeRun, combos: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    diffs = differences(run)
    return {
        "run": run.to_dict(),
        "filters": {str(s): {n: m.to_dict() for n, m in d.items()} for s, d in diffs.items()},
        "additivity": [r.to_dict() for r in additivity(run, combos)],
    }
