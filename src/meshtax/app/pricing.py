"""Pricing call graphs with a profile for :mod:`meshtax.app.predict`: the profile, the
machine's speed, a what-if, the architectures, and the prediction itself. Imported once the
trace workers read (numba's kernel, the profile store and the report load meanwhile)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from meshtax.app.predict_options import (
    SPEEDS,
    PredictOptions,
    Progress,
    check_rate,
    load_speedup_file,
    nothing_usable,
    trace_options,
)
from meshtax.app.tail import tail_parts
from meshtax.errors import UsageError
from meshtax.model.ecg import ECG, EcgBatch, ECGError, Service, to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Architecture
from meshtax.model.speed import Speed, describe_scaling
from meshtax.predict.architecture import parse_architectures, predict_architecture
from meshtax.predict.memory import memory_by_architecture, memory_by_service
from meshtax.report.architectures import architecture_section
from meshtax.report.result import PredictionBuilder, prediction_document
from meshtax.store.resolve import resolve_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host
from meshtax.testbed.pinning import nice_of, pinning_of
from meshtax.testbed.speed import speed_on
from meshtax.testbed.system import RealSystem
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.report import ImportReport

__all__ = [
    "Loaded",
    "Pricing",
    "load_batch",
    "load_ecgs",
    "predict_batches",
    "predict_whole",
    "pricing",
    "role_profiles",
    "speed_now",
]


def speed_now(profile: Profile) -> tuple[Speed | None, list[str]]:
    """This machine's speed on the profile's CPUs, for a prediction scaled to it; the profile
    must have been measured on this machine (another machine's costs do not scale by it)."""
    if not profile.platform.same_host(this_host()):
        raise UsageError(
            f"--speed now: profile {profile.name!r} was measured on "
            f"{profile.platform.describe()}, not this machine; its costs do not scale with "
            "this machine's speed"
        )
    if profile.speed is None:
        return None, [
            f"--speed now: profile {profile.name!r} recorded no machine speed (measured before "
            "meshtax measured speed): its costs are used as measured"
        ]
    speed, why = speed_on(RealSystem(), pinning_of(profile), nice=nice_of(profile))
    if speed is None:
        return None, [why or "machine speed not measured"]
    return speed, [describe_scaling(speed, profile.speed)]


def load_ecgs(files: Sequence[str], allow_outside: Sequence[str] = ()) -> list[ECG]:
    from meshtax.traces.ecg_file import load_ecg_file  # jsonschema: not for traces

    ecgs: list[ECG] = []
    for f in files:
        ecgs += load_ecg_file(f, allow_outside=allow_outside)
    if not ecgs:
        raise UsageError("no call graphs given")
    return ecgs


@dataclass(frozen=True)
class Loaded:
    """Graphs to predict, with what their import reported."""

    batch: EcgBatch
    imported: dict[str, Any] | None  # trace import report
    notes: list[str]  # from importing sidecar configurations
    services: dict[str, Service]  # ECG services (connection counts for memory); empty for traces


def load_batch(opts: PredictOptions) -> Loaded:
    """The graphs to predict, from ECG files or traces, in one batch."""
    check_rate(opts)
    if opts.trace_format is None:
        ecgs = load_ecgs(opts.ecg_files, opts.allow_outside)
        if opts.rate is not None:
            ecgs = [
                replace(e, invocations=tuple(replace(i, rate=opts.rate) for i in e.invocations))
                for e in ecgs
            ]
        notes = list(dict.fromkeys(n for e in ecgs for n in e.meta.get("notes", ())))
        try:
            batch = to_batch(ecgs)
        except ValueError as e:  # one service, two sidecars in two files
            raise ECGError(", ".join(opts.ecg_files), [str(e)]) from None
        return Loaded(batch, None, notes, {k: v for e in ecgs for k, v in e.services.items()})
    from meshtax.traces import load_traces

    fmt, options = trace_options(opts)
    try:
        res = load_traces(list(opts.ecg_files), fmt, options)
    except (TraceFormatError, OSError) as e:
        raise UsageError(f"traces: {e}") from None
    if res.batch.n_graphs == 0:
        nothing_usable(opts, res.report)
    return Loaded(res.batch, res.report.to_dict(), [], {})


@dataclass
class Pricing:
    """How the graphs are priced: the profile (and a lookup of others by name), the
    machine's speed, the architectures, a what-if; warnings so far."""

    profile: Profile
    lookup: Callable[[str | None], Profile]
    speed: Speed | None
    archs: Sequence[Architecture]
    kw: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # (speedup description, lookup after, profile after)
    whatif: tuple[str, Callable[[str | None], Profile], Profile] | None = None


def pricing(opts: PredictOptions, store: ProfileStore, notes: Iterable[str] = ()) -> Pricing:
    """The profile (``opts.profile``, else this host's newest), the speed, the architectures
    and the what-if of ``opts``; ``notes`` join the warnings after the profile's."""
    resolved = resolve_profile(
        store, opts.profile, this_host(), accept_unclosed=opts.accept_unclosed
    )
    profile, warnings = resolved.profile, [*resolved.warnings, *notes]

    def lookup(name: str | None) -> Profile:
        return profile if name is None or name == profile.name else store.get(name)

    speed = None
    if opts.speed == "now":
        speed, said = speed_now(profile)
        warnings += said
    elif opts.speed != "profile":
        raise UsageError(f"speed must be one of {', '.join(SPEEDS)}, got {opts.speed!r}")
    archs = parse_architectures(",".join(opts.architectures or ("sidecar",)))
    if opts.pods_per_node < 1:
        raise UsageError(f"pods per node {opts.pods_per_node}; expected at least 1")
    named = {Architecture.NODE_L4: opts.node_profile, Architecture.WAYPOINT: opts.waypoint_profile}
    roles, rw = role_profiles(store, archs, named, opts.accept_unclosed)
    warnings += rw
    kw: dict[str, Any] = {
        "pods_per_node": opts.pods_per_node,
        "pod_cpus": opts.pod_cpus,
        "roles": roles,
    }
    whatif = None
    if opts.speedup:
        # the speedup's schema (jsonschema) imported when one is given
        from meshtax.predict.whatif import apply_speedup, speedup_from_dict

        sp = speedup_from_dict(load_speedup_file(opts.speedup), opts.speedup)
        after_profile, sw = apply_speedup(profile, sp, store.get)
        warnings += sw

        def lookup_after(name: str | None) -> Profile:
            return after_profile if name is None or name == profile.name else store.get(name)

        whatif = (sp.describe(), lookup_after, after_profile)
    return Pricing(profile, lookup, speed, archs, kw, warnings, whatif)


def role_profiles(
    store: ProfileStore,
    archs: Sequence[Architecture],
    named: Mapping[Architecture, str | None] | None = None,
    accept_unclosed: bool = False,
) -> tuple[dict[Architecture, str], list[str]]:
    """The profiles that price the node proxy and the waypoint (by name), and what to say
    about them: the ones ``named``, else this machine's newest of that role, else none (the
    role is priced from the sidecar profile, a stand-in)."""
    out: dict[Architecture, str] = {}
    said: list[str] = []
    wanted = dict(named or {})
    # a waypoint runs on node-l4
    needs: tuple[Architecture, ...] = ()
    if Architecture.NODE_L4 in archs or Architecture.WAYPOINT in archs:
        needs = (Architecture.NODE_L4,)
    if Architecture.WAYPOINT in archs:
        needs += (Architecture.WAYPOINT,)
    for role in needs:
        name = wanted.get(role)
        prof = store.get(name) if name else store.for_host(this_host(), role.value)
        if prof is None:
            said.append(
                f"no {role.value} profile on this machine (`meshtax profile --architecture "
                f"{role.value}`): {role.value} crossings are priced from the sidecar profile"
            )
            continue
        if prof.platform.architecture != role.value:
            raise UsageError(
                f"profile {prof.name!r} is not a {role.value} profile (measured as "
                f"{prof.platform.architecture or 'a sidecar'})"
            )
        out[role] = prof.name
        if prof.unclosed and not accept_unclosed:
            said.append(f"{role.value} profile {prof.name!r} did not close: {prof.unclosed_modes}")
        if not name:
            said.append(f"{role.value} crossings priced from {prof.name!r} (this machine's newest)")
    return out, said


def predict_batches(
    opts: PredictOptions,
    pr: Pricing,
    batches: Iterable[EcgBatch],
    report: ImportReport,
    progress: Progress | None,
) -> dict[str, Any]:
    """Each batch predicted as it comes; the document keeps every graph's numbers as
    columns."""
    build = PredictionBuilder()
    arch, whatif = pr.archs[0], pr.whatif
    try:
        for batch in batches:
            if batch.n_graphs == 0:
                continue
            bp = predict_architecture(batch, pr.lookup, arch, speed=pr.speed, **pr.kw)[1]
            after = None
            if whatif is not None:
                after = predict_architecture(batch, whatif[1], arch, speed=pr.speed, **pr.kw)[1]
            build.add(batch, bp, after)
            if gc.get_freeze_count() == 0:
                # numba and its kernel are loaded for good (a batch was priced): the
                # collector walking their objects again, at exit too, cost ~0.15 s of CPU
                gc.freeze()
            if progress is not None:
                progress(len(build.columns))
    except (TraceFormatError, OSError) as e:
        raise UsageError(f"traces: {e}") from None
    if len(build.columns) == 0:
        nothing_usable(opts, report)
    doc = build.document(
        pr.profile,
        host=this_host(),
        options=opts.to_dict(),
        warnings=pr.warnings,
        whatif=(whatif[0], whatif[2]) if whatif else None,
    )
    doc["import"] = report.to_dict()
    return _with_speed(doc, pr.speed, pr.profile)


def predict_whole(opts: PredictOptions, pr: Pricing, loaded: Loaded) -> dict[str, Any]:
    """Every graph in one batch: predicted, priced per architecture, under load (--tail)."""
    batch, lookup, whatif, speed, kw = loaded.batch, pr.lookup, pr.whatif, pr.speed, pr.kw
    results = [predict_architecture(batch, lookup, a, speed=speed, **kw) for a in pr.archs]
    bp = results[0][1]
    warnings = pr.warnings + [w for _, other in results[1:] for w in other.warnings]
    after = None
    if whatif is not None:
        after = predict_architecture(batch, whatif[1], pr.archs[0], speed=speed, **kw)[1]
    memory, mw = memory_by_service(loaded.services, lookup)
    warnings += mw
    doc = prediction_document(
        batch,
        bp,
        pr.profile,
        host=this_host(),
        options=opts.to_dict(),
        warnings=warnings,
        whatif=(whatif[0], after, whatif[2]) if whatif and after else None,
    )
    if loaded.imported is not None:
        doc["import"] = loaded.imported
    if memory is not None:
        doc["memory"] = memory
    if opts.architectures:
        mem: dict[str, dict[str, Any] | None] = {}
        for a in pr.archs:
            m, aw = (
                memory_by_architecture(loaded.services, lookup, a, opts.pods_per_node)
                if loaded.services
                else (None, [])
            )
            mem[a.value] = m
            doc["warnings"] = list(dict.fromkeys([*doc["warnings"], *aw]))
        roles = {a.value: n for a, n in pr.kw["roles"].items()}
        doc["architectures"] = architecture_section(batch, results, mem, opts.pods_per_node, roles)
    if opts.tail is not None:
        # traces: every graph is a sample of one traffic mix, each call at its pair's rate
        load: Literal["graphs", "pairs"] = "graphs" if opts.trace_format is None else "pairs"
        doc.update(
            tail_parts(batch, lookup, opts.tail, pod_cpus=opts.pod_cpus, speed=speed, load=load)
        )
    return _with_speed(doc, speed, pr.profile)


def _with_speed(doc: dict[str, Any], speed: Speed | None, profile: Profile) -> dict[str, Any]:
    if speed is not None:
        doc["speed"] = {
            "now": speed.to_dict(),
            "profile": profile.speed.to_dict() if profile.speed else None,
        }
    return doc
