"""What ``meshtax predict`` is asked (:class:`PredictOptions`) and the light helpers both
its entry point (:mod:`meshtax.app.predict`) and the pricing (:mod:`meshtax.app.pricing`)
use: nothing here imports the prediction engine, so traces start being read first."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from meshtax import safeio
from meshtax.app.tail import TailRequest
from meshtax.errors import MeshtaxError, UsageError
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.report import ImportReport

__all__ = [
    "SPEEDS",
    "PredictOptions",
    "Progress",
    "check_rate",
    "load_speedup_file",
    "nothing_usable",
    "trace_options",
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
    # profiles measured in a role (`meshtax profile --architecture`); None: this machine's
    # newest of that role, if any, else the role is priced from the sidecar profile
    node_profile: str | None = None
    waypoint_profile: str | None = None
    tail: TailRequest | None = None  # percentiles under load and saturation (app.tail)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SPEEDS = ("profile", "now")


def load_speedup_file(path: str) -> Any:
    """The parsed speedup document (validated by
    :func:`~meshtax.predict.whatif.speedup_from_dict`)."""
    from meshtax.predict.whatif import SpeedupError

    try:
        return safeio.load_document(path, "a speedup file", nonfinite=True)
    except MeshtaxError as e:
        raise SpeedupError(str(e), file=path) from None


def check_rate(opts: PredictOptions) -> None:
    if opts.rate is not None and not (math.isfinite(opts.rate) and 0 < opts.rate <= 1e9):
        raise UsageError(f"rate {opts.rate!r}; expected requests/s > 0 and ≤ 1e9")


def trace_options(opts: PredictOptions, batch_spans: int | None = None) -> tuple[str, Any]:
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


def nothing_usable(opts: PredictOptions, report: ImportReport) -> NoReturn:
    raise UsageError(
        f"traces: no usable call graph in {', '.join(opts.ecg_files)}:\n{report.summary()}"
    )


#: called after each batch predicted with the number of graphs predicted so far
Progress = Callable[[int], None]
