"""Predict and study: call graphs (ECG files or traces) or an ingested store, priced with a
profile, with what-if speedups. Options in, result documents out (no argv, no printing).

``predict --traces`` starts reading before anything else: this module imports what reading
needs, starts the workers, and only then imports :mod:`meshtax.app.pricing` (the profile,
numba's critical-path kernel, the report), which loads while they read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshtax.app.predict_options import (
    SPEEDS,
    PredictOptions,
    Progress,
    load_speedup_file,
    trace_options,
)
from meshtax.errors import UsageError
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.report import ImportReport

if TYPE_CHECKING:
    from meshtax.model.profile import Profile
    from meshtax.store.sqlite import ProfileStore

__all__ = [
    "SPEEDS",
    "PredictOptions",
    "StudyOptions",
    "load_speedup_file",
    "parse_study_config",
    "predict_files",
    "study",
]


def predict_files(
    opts: PredictOptions,
    store: ProfileStore,
    *,
    progress: Progress | None = None,
    batch_spans: int | None = None,
) -> dict[str, Any]:
    """Predict every graph of the ECG files (or traces); returns the result document.

    Traces are read and predicted batch by batch (:func:`meshtax.traces.iter_graph_batches`;
    ``batch_spans``: spans a batch, None for the importer's default), the reading started
    before the pricing is loaded, the document keeping each graph's numbers as columns
    (~250 B a graph, not a dict of ~4 kB; beyond 4 096 graphs in a temporary file); counted
    rates (no ``rate``) hold the batches' columns until every graph is read. ECG files, and
    ``--architecture``/``--tail``, take every graph in one batch. ``progress(graphs so
    far)`` is called after each batch.
    """
    # one batch: ECG files are few graphs; architectures place unplaced services on nodes
    # by name over every service, and --tail loads each caller→callee pair with its rate
    # over every graph: both need every graph at once
    if opts.trace_format is None or opts.architectures or opts.tail is not None:
        from meshtax.app import pricing

        loaded = pricing.load_batch(opts)
        return pricing.predict_whole(opts, pricing.pricing(opts, store, loaded.notes), loaded)
    from meshtax.traces import iter_graph_batches

    fmt, options = trace_options(opts, batch_spans)
    report = ImportReport(", ".join(opts.ecg_files), fmt)
    try:
        batches = iter_graph_batches(list(opts.ecg_files), fmt, options, report)
    except (TraceFormatError, OSError) as e:
        raise UsageError(f"traces: {e}") from None
    with batches:  # the workers read from here on, while the pricing loads
        from meshtax.app import pricing

        return pricing.predict_batches(
            opts, pricing.pricing(opts, store), batches, report, progress
        )


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
    from meshtax.predict.whatif import apply_speedup, speedup_from_dict
    from meshtax.store.resolve import resolve_profile
    from meshtax.study import StudyConfig, run_study
    from meshtax.testbed.host import this_host

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
