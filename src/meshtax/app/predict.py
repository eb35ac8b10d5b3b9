"""Predict and study: call graphs (ECG files or traces) or an ingested store, priced with a
profile, with what-if speedups. Options in, result documents out (no argv, no printing)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, NoReturn

from meshtax import safeio
from meshtax.app.tail import TailRequest, tail_parts
from meshtax.errors import MeshtaxError, UsageError
from meshtax.model.ecg import ECG, EcgBatch, ECGError, Service, to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Architecture, Mode, SidecarConfig
from meshtax.model.speed import Speed, describe_scaling
from meshtax.predict.architecture import parse_architectures, predict_architecture
from meshtax.predict.memory import memory_by_architecture, memory_by_service
from meshtax.predict.whatif import SpeedupError, apply_speedup, speedup_from_dict
from meshtax.report.architectures import architecture_section
from meshtax.report.result import PredictionBuilder, prediction_document
from meshtax.store.resolve import resolve_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host
from meshtax.testbed.pinning import pinning_of
from meshtax.testbed.speed import speed_on
from meshtax.testbed.system import RealSystem
from meshtax.traces.ecg_file import load_ecg_file
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.report import ImportReport

__all__ = [
    "Loaded",
    "SPEEDS",
    "PredictOptions",
    "StudyOptions",
    "load_batch",
    "load_ecgs",
    "load_speedup_file",
    "parse_study_config",
    "predict_files",
    "speed_now",
    "study",
]


@dataclass(frozen=True)
class PredictOptions:
    ecg_files: tuple[str, ...]
    profile: str | None = None  # None: the newest measured profile of this host
    speedup: str | None = None
    rate: float | None = None  # override every invocation's rate (requests/s)
    trace_format: str | None = None  # None: ECG files; "auto" or a format: distributed traces
    sidecar_mode: str = "http"  # with traces: every traced service's sidecar mode
    service_map: str | None = None  # with traces: trace name → Kubernetes name overrides
    pod_cpus: int | None = None  # CPUs the pods share (None: each pod has CPUs of its own)
    accept_unclosed: bool = False  # use a profile that failed its closure check (with a warning)
    speed: str = "profile"  # "now": measure this machine's speed and scale the profile's costs
    allow_outside: tuple[str, ...] = ()  # directories ECG files may reference besides their own
    # mesh architectures to compare (the first prices the main prediction); (): sidecar only
    architectures: tuple[str, ...] = ()
    pods_per_node: int = 1  # services without a node: this many to a node, by name
    tail: TailRequest | None = None  # percentiles under load and saturation (app.tail)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SPEEDS = ("profile", "now")


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
    speed, why = speed_on(RealSystem(), pinning_of(profile))
    if speed is None:
        return None, [why or "machine speed not measured"]
    return speed, [describe_scaling(speed, profile.speed)]


def load_ecgs(files: Sequence[str], allow_outside: Sequence[str] = ()) -> list[ECG]:
    ecgs: list[ECG] = []
    for f in files:
        ecgs += load_ecg_file(f, allow_outside=allow_outside)
    if not ecgs:
        raise UsageError("no call graphs given")
    return ecgs


def load_speedup_file(path: str) -> Any:
    """The parsed speedup document (validated by :func:`speedup_from_dict`)."""
    try:
        return safeio.load_document(path, "a speedup file", nonfinite=True)
    except MeshtaxError as e:
        raise SpeedupError(str(e), file=path) from None


@dataclass(frozen=True)
class Loaded:
    """Graphs to predict, with what their import reported."""

    batch: EcgBatch
    imported: dict[str, Any] | None  # trace import report
    notes: list[str]  # from importing sidecar configurations
    services: dict[str, Service]  # ECG services (connection counts for memory); empty for traces


def _check_rate(opts: PredictOptions) -> None:
    if opts.rate is not None and not (math.isfinite(opts.rate) and 0 < opts.rate <= 1e9):
        raise UsageError(f"rate {opts.rate!r}; expected requests/s > 0 and ≤ 1e9")


def load_batch(opts: PredictOptions) -> Loaded:
    """The graphs to predict, from ECG files or traces, in one batch."""
    _check_rate(opts)
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

    fmt, options = _trace_options(opts)
    try:
        res = load_traces(list(opts.ecg_files), fmt, options)
    except (TraceFormatError, OSError) as e:
        raise UsageError(f"traces: {e}") from None
    if res.batch.n_graphs == 0:
        _nothing_usable(opts, res.report)
    return Loaded(res.batch, res.report.to_dict(), [], {})


def _trace_options(opts: PredictOptions, batch_spans: int | None = None) -> tuple[str, Any]:
    """The traces' format and importer options."""
    from meshtax.traces import SpanOptions, detect_format, load_service_map

    sidecar = SidecarConfig(Mode(opts.sidecar_mode))
    try:
        fmt = None if opts.trace_format == "auto" else opts.trace_format
        fmt = fmt or detect_format(opts.ecg_files[0])
        if fmt.startswith("alibaba"):
            from meshtax.traces import AlibabaOptions  # pyarrow: only for Alibaba

            rate = {"rate": opts.rate} if opts.rate is not None else {}
            return fmt, AlibabaOptions(sidecar=sidecar, **rate)
        smap = load_service_map(opts.service_map) if opts.service_map else {}
        more = {"batch_spans": batch_spans} if batch_spans else {}
        return fmt, SpanOptions(rate=opts.rate, service_map=smap, default_sidecar=sidecar, **more)
    except (TraceFormatError, OSError) as e:
        raise UsageError(f"traces: {e}") from None


def _nothing_usable(opts: PredictOptions, report: ImportReport) -> NoReturn:
    raise UsageError(
        f"traces: no usable call graph in {', '.join(opts.ecg_files)}:\n{report.summary()}"
    )


#: called after each batch predicted with the number of graphs predicted so far
Progress = Callable[[int], None]


def predict_files(
    opts: PredictOptions,
    store: ProfileStore,
    *,
    progress: Progress | None = None,
    batch_spans: int | None = None,
) -> dict[str, Any]:
    """Predict every graph of the ECG files (or traces); returns the result document.

    Traces are read and predicted batch by batch (:func:`meshtax.traces.iter_graph_batches`;
    ``batch_spans``: spans a batch, None for the importer's default), the document keeping
    each graph's numbers as columns (~250 B a graph, not a dict of ~4 kB; beyond 4 096
    graphs in a temporary file); counted rates
    (no ``rate``) hold the batches' columns until every graph is read. ECG files, and
    ``--architecture``/``--tail``, take every graph in one batch (see :func:`_whole`).
    ``progress(graphs so far)`` is called after each batch.
    """
    # one batch: ECG files are few graphs; architectures place unplaced services on nodes
    # by name over every service, and --tail loads each caller→callee pair with its rate
    # over every graph: both need every graph at once
    whole = opts.trace_format is None or bool(opts.architectures) or opts.tail is not None
    loaded = load_batch(opts) if whole else None
    fmt, options = (None, None) if whole else _trace_options(opts, batch_spans)
    resolved = resolve_profile(
        store, opts.profile, this_host(), accept_unclosed=opts.accept_unclosed
    )
    profile, warnings = resolved.profile, list(resolved.warnings)
    warnings += loaded.notes if loaded else []

    def lookup(name: str | None) -> Profile:
        return profile if name is None or name == profile.name else store.get(name)

    speed = None
    if opts.speed == "now":
        speed, notes = speed_now(profile)
        warnings += notes
    elif opts.speed != "profile":
        raise UsageError(f"speed must be one of {', '.join(SPEEDS)}, got {opts.speed!r}")
    archs = parse_architectures(",".join(opts.architectures or ("sidecar",)))
    if opts.pods_per_node < 1:
        raise UsageError(f"pods per node {opts.pods_per_node}; expected at least 1")
    kw: dict[str, Any] = {"pods_per_node": opts.pods_per_node, "pod_cpus": opts.pod_cpus}
    whatif = None
    if opts.speedup:
        sp = speedup_from_dict(load_speedup_file(opts.speedup), opts.speedup)
        after_profile, sw = apply_speedup(profile, sp, store.get)
        warnings += sw

        def lookup_after(name: str | None) -> Profile:
            return after_profile if name is None or name == profile.name else store.get(name)

        whatif = (sp.describe(), lookup_after, after_profile)
    if loaded is not None:
        return _whole(opts, loaded, profile, lookup, warnings, whatif, speed, archs, kw)
    from meshtax.traces import iter_graph_batches

    assert fmt is not None
    report = ImportReport(", ".join(opts.ecg_files), fmt)
    build = PredictionBuilder()
    try:
        for batch in iter_graph_batches(list(opts.ecg_files), fmt, options, report):
            if batch.n_graphs == 0:
                continue
            bp = predict_architecture(batch, lookup, archs[0], speed=speed, **kw)[1]
            after = None
            if whatif is not None:
                after = predict_architecture(batch, whatif[1], archs[0], speed=speed, **kw)[1]
            build.add(batch, bp, after)
            if progress is not None:
                progress(len(build.columns))
    except (TraceFormatError, OSError) as e:
        raise UsageError(f"traces: {e}") from None
    if len(build.columns) == 0:
        _nothing_usable(opts, report)
    doc = build.document(
        profile,
        host=this_host(),
        options=opts.to_dict(),
        warnings=warnings,
        whatif=(whatif[0], whatif[2]) if whatif else None,
    )
    doc["import"] = report.to_dict()
    return _with_speed(doc, speed, profile)


def _whole(
    opts: PredictOptions,
    loaded: Loaded,
    profile: Profile,
    lookup: Callable[[str | None], Profile],
    warnings: list[str],
    whatif: tuple[str, Callable[[str | None], Profile], Profile] | None,
    speed: Speed | None,
    archs: Sequence[Architecture],
    kw: dict[str, Any],
) -> dict[str, Any]:
    """Every graph in one batch: predicted, priced per architecture, under load (--tail)."""
    batch = loaded.batch
    results = [predict_architecture(batch, lookup, a, speed=speed, **kw) for a in archs]
    bp = results[0][1]
    warnings += [w for _, other in results[1:] for w in other.warnings]
    after = None
    if whatif is not None:
        after = predict_architecture(batch, whatif[1], archs[0], speed=speed, **kw)[1]
    memory, mw = memory_by_service(loaded.services, lookup)
    warnings += mw
    doc = prediction_document(
        batch,
        bp,
        profile,
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
        for a in archs:
            m, aw = (
                memory_by_architecture(loaded.services, lookup, a, opts.pods_per_node)
                if loaded.services
                else (None, [])
            )
            mem[a.value] = m
            doc["warnings"] = list(dict.fromkeys([*doc["warnings"], *aw]))
        doc["architectures"] = architecture_section(batch, results, mem, opts.pods_per_node)
    if opts.tail is not None:
        # traces: every graph is a sample of one traffic mix, each call at its pair's rate
        load: Literal["graphs", "pairs"] = "graphs" if opts.trace_format is None else "pairs"
        doc.update(
            tail_parts(batch, lookup, opts.tail, pod_cpus=opts.pod_cpus, speed=speed, load=load)
        )
    return _with_speed(doc, speed, profile)


def _with_speed(doc: dict[str, Any], speed: Speed | None, profile: Profile) -> dict[str, Any]:
    if speed is not None:
        doc["speed"] = {
            "now": speed.to_dict(),
            "profile": profile.speed.to_dict() if profile.speed else None,
        }
    return doc


@dataclass(frozen=True)
class StudyOptions:
    """``meshtax study``: every graph of an ingested store under each configuration."""

    store_dir: str
    out_dir: str
    profile: str | None = None
    configs: tuple[str, ...] = ()  # NAME=MODE[+FILTER…][+mtls[1.2|1.3]]; empty: the paper's five
    speedup: str | None = None
    engine: str = "local"
    scheduler: str | None = None
    progress: bool = False
    accept_unclosed: bool = False


def parse_study_config(text: str) -> tuple[str, SidecarConfig]:
    """``NAME=MODE[+FILTER…][+mtls[1.2|1.3]]`` → (name, sidecar configuration)."""
    name, _, spec = text.partition("=")
    parts = [p.strip() for p in (spec or name).split("+") if p.strip()]
    try:
        mode = Mode(parts[0])
    except (ValueError, IndexError):
        raise UsageError(
            f"--config {text!r}: expected NAME=MODE[+FILTER…][+mtls[1.2|1.3]] "
            "with MODE tcp, http or grpc"
        ) from None
    rest = parts[1:]
    tls = [p for p in rest if p.startswith("mtls")]
    version = tls[-1][4:] or None if tls else None
    try:
        filters = tuple(p for p in rest if not p.startswith("mtls"))
        return name, SidecarConfig(mode, filters, bool(tls), tls_version=version)
    except ValueError as e:
        raise UsageError(f"--config {text!r}: {e} (write +mtls, +mtls1.2 or +mtls1.3)") from None


def study(opts: StudyOptions, store: ProfileStore) -> tuple[dict[str, Any], Profile, list[str]]:
    """Run the study; returns its summary document, the profile and the warnings."""
    from meshtax.study import StudyConfig, run_study

    resolved = resolve_profile(
        store, opts.profile, this_host(), accept_unclosed=opts.accept_unclosed
    )
    prof, warnings = resolved.profile, list(resolved.warnings)
    cfgs = [StudyConfig(*parse_study_config(c)) for c in opts.configs] or None
    after = None
    if opts.speedup:
        sp = speedup_from_dict(load_speedup_file(opts.speedup), opts.speedup)
        after, sw = apply_speedup(prof, sp, store.get)
        warnings += sw
    summ = run_study(
        opts.store_dir,
        cfgs,
        prof,
        opts.out_dir,
        engine=opts.engine,  # type: ignore[arg-type]
        scheduler=opts.scheduler,
        speedup_profile=after,
        progress=opts.progress,
    )
    return summ.to_dict(), prof, warnings
