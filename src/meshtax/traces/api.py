"""Entry points of the trace importers: load into memory, or ingest into a Parquet store."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from meshtax.model.ecg import ECG, EcgBatch, to_batch
from meshtax.traces.alibaba import AlibabaOptions, TraceFormatError, iter_alibaba, sniff_version
from meshtax.traces.report import ImportReport
from meshtax.traces.store import Store, StoreWriter, concat_batches

Format = Literal["jaeger", "otlp", "otlp-proto", "zipkin", "alibaba-v2021", "alibaba-v2022"]
FORMATS: tuple[str, ...] = (
    "jaeger",
    "otlp",
    "otlp-proto",
    "zipkin",
    "alibaba-v2021",
    "alibaba-v2022",
)
PathIn = str | os.PathLike[str]


@dataclass(frozen=True)
class ImportResult:
    """Imported graphs: ``batch`` always; ``ecgs`` for span formats (validated ECG objects;
    empty for Alibaba, whose graphs go straight to the columnar form)."""

    batch: EcgBatch
    ecgs: tuple[ECG, ...]
    report: ImportReport


def detect_format(path: PathIn) -> str:
    """Guess the format from the file's beginning (CSV header or JSON keys)."""
    p = Path(path)
    if p.suffix in (".pb", ".binpb", ".proto", ".protobuf"):
        return "otlp-proto"
    with open(p, "rb") as f:
        head = f.read(4096)
    if (
        head[:2] == b"\x1f\x8b"
        or b"rpcid" in head.split(b"\n")[0]
        or b"rpc_id" in head.split(b"\n")[0]
    ):
        return sniff_version(p)
    text = head.lstrip()
    if not text:
        raise TraceFormatError(f"{p}: empty file")
    if text[:1] == b"[":
        return "zipkin"
    if b'"resourceSpans"' in head or b'"resource_spans"' in head:
        return "otlp"
    if b'"data"' in head or b'"traceID"' in head:
        return "jaeger"
    raise TraceFormatError(f"{p}: cannot tell the trace format; pass one of {', '.join(FORMATS)}")


def load_traces(
    path: PathIn | Sequence[PathIn], format: str | None = None, options: Any = None
) -> ImportResult:
    """Import traces into memory.

    ``format``: one of :data:`FORMATS` (None: detected from the first file).
    ``options``: :class:`~meshtax.traces.alibaba.AlibabaOptions` for Alibaba,
    :class:`~meshtax.traces.spans.SpanOptions` for Jaeger/OTLP/Zipkin (None: defaults).
    For large Alibaba inputs use :func:`ingest`, which streams into a store.
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise TraceFormatError("no input files")
    fmt = format or detect_format(paths[0])
    if fmt not in FORMATS:
        raise TraceFormatError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt.startswith("alibaba"):
        rep = ImportReport(", ".join(map(str, paths)), fmt)
        opts = options if isinstance(options, AlibabaOptions) else AlibabaOptions()
        batches = list(iter_alibaba(paths, fmt, opts, rep))  # type: ignore[arg-type]
        return ImportResult(concat_batches(batches) if len(batches) != 1 else batches[0], (), rep)
    from meshtax.traces.spans import SpanOptions, load_spans

    sopts = options if isinstance(options, SpanOptions) else SpanOptions()
    ecgs, rep = load_spans(paths, fmt, sopts)
    return ImportResult(to_batch(ecgs), tuple(ecgs), rep)


def ingest(
    path: PathIn | Sequence[PathIn],
    out_dir: PathIn,
    format: str | None = None,
    options: Any = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> tuple[Store, ImportReport]:
    """Import traces into a partitioned Parquet store at ``out_dir`` (streaming for Alibaba:
    memory is bounded by ``AlibabaOptions.bucket_bytes``/``partition_graphs``). The report is
    also saved in the store's manifest."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    fmt = format or detect_format(paths[0])
    rep = ImportReport(", ".join(map(str, paths)), fmt)
    w = StoreWriter(out_dir, source=rep.source, overwrite=overwrite)
    if fmt.startswith("alibaba"):
        opts = options if isinstance(options, AlibabaOptions) else AlibabaOptions()
        with _bar(progress, f"ingest {fmt}") as cb:
            for b in iter_alibaba(paths, fmt, opts, rep, progress=cb):  # type: ignore[arg-type]
                w.append(b)
    else:
        res = load_traces(paths, fmt, options)
        rep = res.report
        w.append(res.batch)
    return w.close(rep.to_dict()), rep


class _bar:
    """A rich progress bar fed by (phase, done, total) callbacks, or nothing."""

    def __init__(self, on: bool, label: str) -> None:
        self.on = on
        self.label = label
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Any:
        if not self.on:
            return None
        from rich.progress import Progress

        self.bar = Progress()
        self.bar.start()

        def cb(phase: str, done: int, total: int) -> None:
            if phase not in self.tasks:
                self.tasks[phase] = self.bar.add_task(f"{self.label}: {phase}", total=total)
            self.bar.update(self.tasks[phase], completed=done, total=total)

        return cb

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
