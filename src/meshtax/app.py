"""Library entry points behind the CLI: options in, result documents out (no argv, no printing)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from meshtax import safeio
from meshtax.errors import MeshtaxError, UsageError
from meshtax.host import this_host
from meshtax.model.ecg import ECG, EcgBatch, ECGError, Service, to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import predict_batch
from meshtax.predict.memory import memory_by_service
from meshtax.predict.whatif import SpeedupError, apply_speedup, speedup_from_dict
from meshtax.report.result import prediction_document
from meshtax.store.sqlite import ProfileStore, StoreError
from meshtax.traces.ecg_file import load_ecg_file


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
    allow_outside: tuple[str, ...] = ()  # directories ECG files may reference besides their own

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_profile(store: ProfileStore, name: str | None) -> tuple[Profile, list[str]]:
    """The named profile, or this host's newest measured one. Warns when the platform differs."""
    host = this_host()
    if name is None:
        p = store.for_host(host)
        if p is None and store.unusable:
            names = ", ".join(repr(n) for n, _ in store.unusable)
            raise UsageError(
                f"no usable profile of this machine: {names} failed validation "
                f"({store.unusable[0][1]}); measure again, or name one with --profile"
            )
        if p is None:
            raise UsageError(
                "no profile of this machine yet. Measure one with `meshtax profile --quick` (as root), "
                "or name one explicitly, e.g. `--profile reference` (published data of another platform)."
            )
        return p, []
    p = store.get(name)
    warnings = []
    if not p.platform.same_host(host):
        warnings.append(
            f"profile {p.name!r} was {'published' if p.provenance.source == 'published' else 'measured'} on a different platform "
            f"({p.platform.describe()}), not this machine ({host.describe()}); predictions describe that platform"
        )
    return p, warnings


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


def load_batch(opts: PredictOptions) -> Loaded:
    """The graphs to predict, from ECG files or traces."""
    if opts.rate is not None and not (math.isfinite(opts.rate) and 0 < opts.rate <= 1e9):
        raise UsageError(f"rate {opts.rate!r}; expected requests/s > 0 and ≤ 1e9")
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
    from meshtax.traces import (
        AlibabaOptions,
        SpanOptions,
        TraceFormatError,
        detect_format,
        load_service_map,
        load_traces,
    )

    sidecar = SidecarConfig(Mode(opts.sidecar_mode))
    for path in opts.ecg_files:
        safeio.check_regular(path, "a trace file")
    try:
        fmt = None if opts.trace_format == "auto" else opts.trace_format
        fmt = fmt or detect_format(opts.ecg_files[0])
        options: Any
        if fmt.startswith("alibaba"):
            options = AlibabaOptions(
                sidecar=sidecar, **({"rate": opts.rate} if opts.rate is not None else {})
            )
        else:
            smap = load_service_map(opts.service_map) if opts.service_map else {}
            options = SpanOptions(rate=opts.rate, service_map=smap, default_sidecar=sidecar)
        res = load_traces(list(opts.ecg_files), fmt, options)
    except (TraceFormatError, OSError) as e:
        raise UsageError(f"traces: {e}") from None
    if res.batch.n_graphs == 0:
        raise UsageError(
            f"traces: no usable call graph in {', '.join(opts.ecg_files)}:\n{res.report.summary()}"
        )
    return Loaded(res.batch, res.report.to_dict(), [], {})


def predict_files(opts: PredictOptions, store: ProfileStore) -> dict[str, Any]:
    """Predict every graph of the ECG files (or traces); returns the result document."""
    loaded = load_batch(opts)
    batch = loaded.batch
    profile, warnings = choose_profile(store, opts.profile)
    warnings += loaded.notes

    def lookup(name: str | None) -> Profile:
        return profile if name is None or name == profile.name else store.get(name)

    bp = predict_batch(batch, lookup, pod_cpus=opts.pod_cpus)
    whatif = None
    if opts.speedup:
        sp = speedup_from_dict(load_speedup_file(opts.speedup), opts.speedup)
        after_profile, sw = apply_speedup(profile, sp, store.get)
        warnings += sw

        def lookup_after(name: str | None) -> Profile:
            return after_profile if name is None or name == profile.name else store.get(name)

        whatif = (
            sp.describe(),
            predict_batch(batch, lookup_after, pod_cpus=opts.pod_cpus),
            after_profile,
        )
    memory, mw = memory_by_service(loaded.services, lookup)
    warnings += mw
    doc = prediction_document(
        batch,
        bp,
        profile,
        host=this_host(),
        options=opts.to_dict(),
        warnings=warnings,
        whatif=whatif,
    )
    if loaded.imported is not None:
        doc["import"] = loaded.imported
    if memory is not None:
        doc["memory"] = memory
    return doc


__all__ = [
    "PredictOptions",
    "UsageError",
    "predict_files",
    "choose_profile",
    "ECGError",
    "StoreError",
    "SpeedupError",
]
