"""Entry points of the trace importers: load into memory, or ingest into a Parquet store."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from meshtax.model.ecg import ECG, EcgBatch
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.inputs import expand, iter_sources
from meshtax.traces.inputs import head as read_head
from meshtax.traces.report import ImportReport

if TYPE_CHECKING:
    from meshtax.traces.pairing import Paired
    from meshtax.traces.spans import SpanOptions
    from meshtax.traces.store import Store

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


class ImportResult:
    """Imported graphs: ``batch`` always; ``ecgs``, for span formats, the validated ECG
    objects (built from the batch on first use; empty for Alibaba, whose graphs go straight
    to the columnar form)."""

    def __init__(
        self,
        batch: EcgBatch,
        ecgs: Sequence[ECG] | Callable[[], Sequence[ECG]],
        report: ImportReport,
    ) -> None:
        self.batch = batch
        self.report = report
        self._ecgs = ecgs

    @property
    def ecgs(self) -> tuple[ECG, ...]:
        if callable(self._ecgs):
            self._ecgs = tuple(self._ecgs())
        return tuple(self._ecgs)


def detect_format(path: PathIn) -> str:
    """Guess the format from the input's beginning (CSV header or JSON keys; gzip and zstd
    are looked into). A directory or glob: its first file; ``-``: stdin."""
    src = next(iter_sources(path))
    head = read_head(src)
    first = head.split(b"\n")[0]
    if not src.is_stdin and (b"rpcid" in first or b"rpc_id" in first):
        from meshtax.traces.alibaba import sniff_version

        return sniff_version(src.name)
    if Path(src.name).suffix in (".pb", ".binpb", ".proto", ".protobuf"):
        return "otlp-proto"
    text = head.lstrip()
    if not text:
        raise TraceFormatError(f"{src.name}: empty file")
    if b'"resourceSpans"' in head or b'"resource_spans"' in head:
        return "otlp"
    if text[:1] == b"[":
        rest = text[1:].lstrip()
        if rest[:1] == b"{" and (b'"spans"' in head or b'"processes"' in head):
            return "jaeger"  # a list of Jaeger traces
        return "zipkin"
    if b'"data"' in head or b'"traceID"' in head:
        return "jaeger"
    if text[:1] not in (b"{", b"["):
        return "otlp-proto" if _looks_binary(head) else _unknown(src.name)
    return _unknown(src.name)


def _looks_binary(head: bytes) -> bool:
    return b"\x00" in head or any(b > 0x7F for b in head[:64])


def _unknown(name: str) -> str:
    raise TraceFormatError(
        f"{name}: cannot tell the trace format; pass one of {', '.join(FORMATS)}"
    )


def load_traces(
    path: PathIn | Sequence[PathIn], format: str | None = None, options: Any = None
) -> ImportResult:
    """Import traces into memory.

    ``path``: files, directories, globs or ``-`` (stdin); gzip and zstd are read.
    ``format``: one of :data:`FORMATS` (None: detected from the first file).
    ``options``: :class:`~meshtax.traces.alibaba.AlibabaOptions` for Alibaba,
    :class:`~meshtax.traces.spans.SpanOptions` for Jaeger/OTLP/Zipkin (None: defaults).
    For large inputs use :func:`ingest` (a store) or :func:`~meshtax.traces.stream.iter_batches`.
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise TraceFormatError("no input files")
    fmt = format or detect_format(paths[0])
    if fmt not in FORMATS:
        raise TraceFormatError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt.startswith("alibaba"):
        from meshtax.traces.alibaba import AlibabaOptions, iter_alibaba
        from meshtax.traces.store import concat_batches

        files = [s.name for s in expand(paths)]
        rep = ImportReport(", ".join(map(str, paths)), fmt)
        opts = options if isinstance(options, AlibabaOptions) else AlibabaOptions()
        batches = list(iter_alibaba(files, fmt, opts, rep))  # type: ignore[arg-type]
        return ImportResult(concat_batches(batches) if len(batches) != 1 else batches[0], (), rep)
    from meshtax.traces.spans import SpanOptions, to_ecgs
    from meshtax.traces.stream import load_paired

    sopts = options if isinstance(options, SpanOptions) else SpanOptions()
    paired, rep = load_paired(paths, fmt, sopts)
    return ImportResult(paired.batch, lambda: to_ecgs(paired, sopts), rep)


class GraphBatches(Iterator[EcgBatch]):
    """The graphs of traces batch by batch (:func:`iter_graph_batches`); :meth:`close` (or a
    with block) stops the reading before the input's end."""

    def __init__(self, batches: Iterator[EcgBatch], close: Callable[[], None] | None) -> None:
        self._batches = batches
        self._close = close

    def __next__(self) -> EcgBatch:
        return next(self._batches)

    def close(self) -> None:
        if self._close is not None:
            self._close()

    def __enter__(self) -> GraphBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_graph_batches(
    path: PathIn | Sequence[PathIn],
    format: str,
    options: Any,
    report: ImportReport,
) -> GraphBatches:
    """The graphs of the traces batch by batch, for a consumer that needs each graph once
    (``meshtax predict --traces``): Alibaba batches of ``AlibabaOptions.partition_graphs``,
    span batches of a :class:`~meshtax.traces.stream.Reading`, each with its services'
    nodes. Counts go to ``report``. Span files are read from this call on (the workers read
    while the caller prepares). Memory is a few batches, except for span formats with
    counted rates (``SpanOptions.rate`` None): a pair's rate counts its calls in every graph,
    so every batch's columns are held until the input ends (as :func:`load_traces` does)."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise TraceFormatError("no input files")
    if format not in FORMATS:
        raise TraceFormatError(f"format {format!r}: expected one of {', '.join(FORMATS)}")
    if format.startswith("alibaba"):
        from meshtax.traces.alibaba import AlibabaOptions, iter_alibaba

        files = [s.name for s in expand(paths)]
        opts = options if isinstance(options, AlibabaOptions) else AlibabaOptions()
        # read in this process, as they are asked for: nothing to stop
        return GraphBatches(iter_alibaba(files, format, opts, report), None)  # type: ignore[arg-type]
    from meshtax.traces.spans import SpanOptions
    from meshtax.traces.stream import Reading

    sopts = options if isinstance(options, SpanOptions) else SpanOptions()
    reading = Reading(paths, format, sopts, report)
    return GraphBatches(_span_graphs(reading, sopts, report), reading.close)


def _span_graphs(
    parts: Iterator[Paired], options: SpanOptions, report: ImportReport
) -> Iterator[EcgBatch]:
    """Each batch with its services' nodes (and, counted, its rates)."""
    from dataclasses import replace

    from meshtax.traces.spans import fill_rates
    from meshtax.traces.stream import with_nodes

    if options.rate is None:
        held = list(parts)
        fill_rates(held, options.window_s, report)
        held.reverse()
        parts = (held.pop() for _ in range(len(held)))  # each let go once predicted
    nodes: dict[str, str] = {}
    for p in parts:
        for k, v in p.nodes.items():  # OTLP rows paired at the end: their nodes came earlier
            nodes.setdefault(k, v)
        yield with_nodes(replace(p, nodes=nodes), options)


def ingest(
    path: PathIn | Sequence[PathIn],
    out_dir: PathIn,
    format: str | None = None,
    options: Any = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> tuple[Store, ImportReport]:
    """Import traces into a partitioned Parquet store at ``out_dir``, streaming: for Alibaba,
    memory is bounded by ``AlibabaOptions.bucket_bytes``/``partition_graphs``; for spans by
    ``SpanOptions.batch_spans`` when ``SpanOptions.rate`` is given (counted rates need every
    graph before the first is written: the columns of all of them are held). The report is
    also saved in the store's manifest."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    fmt = format or detect_format(paths[0])
    rep = ImportReport(", ".join(map(str, paths)), fmt)
    from meshtax.traces.alibaba import AlibabaOptions, iter_alibaba
    from meshtax.traces.store import StoreWriter

    w = StoreWriter(out_dir, source=rep.source, overwrite=overwrite)
    if fmt.startswith("alibaba"):
        opts = options if isinstance(options, AlibabaOptions) else AlibabaOptions()
        with _bar(progress, f"ingest {fmt}") as cb:
            files = [s.name for s in expand(paths)]
            for b in iter_alibaba(files, fmt, opts, rep, progress=cb):  # type: ignore[arg-type]
                w.append(b)
    else:
        from meshtax.traces.spans import SpanOptions
        from meshtax.traces.stream import iter_batches

        sopts = options if isinstance(options, SpanOptions) else SpanOptions()
        if sopts.rate is None:  # counted rates need every graph first
            res = load_traces(paths, fmt, sopts)
            rep = res.report
            w.append(res.batch)
        else:
            for p in iter_batches(paths, fmt, sopts, rep):
                w.append(p.batch)
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
