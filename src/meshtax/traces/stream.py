"""Span files → paired call-graph batches, in bounded memory, on worker processes.

Inputs (:mod:`meshtax.traces.inputs`): files, directories, globs, ``-`` for stdin, gzip or
zstd. Documents are decoded into span rows; rows of whole traces are paired into calls
(:func:`meshtax.traces.spans.pair_rows`) and come out as :class:`~meshtax.model.ecg.EcgBatch`
columns batch by batch (:func:`iter_batches`): memory holds a few batches, not the input.
Jaeger's ``data`` entries and Zipkin's lists of traces are whole traces and stream; OTLP
exporters write parts of traces in each batch, so OTLP rows are held (compact) until the
input ends, then paired batch by batch. Tasks of about ``SpanOptions.batch_spans`` spans run
on ``SpanOptions.workers`` processes.
"""

from __future__ import annotations

import gc
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from typing import Any, NoReturn

import numpy as np

from meshtax.model.ecg import EcgBatch
from meshtax.traces import decode, inputs, jaeger, otlp, zipkin
from meshtax.traces.errors import TraceFormatError
from meshtax.traces.pairing import Paired
from meshtax.traces.report import ImportReport
from meshtax.traces.spans import FORMATS, SpanOptions, fill_rates, naming, pair_rows

#: format → reader of one document into rows (Jaeger has its own path: traces are cut out)
READERS = {
    "otlp": otlp.read_otlp_json,
    "otlp-proto": otlp.read_otlp_proto,
    "zipkin": zipkin.read_zipkin,
}


def _read_source(
    src: inputs.Source, fmt: str, limit: int, out: decode.SpanRows, split: list[Any] | None
) -> None:
    """Decode every document of ``src`` into ``out``; with ``split``, a Jaeger document's raw
    traces are put there instead (to be decoded in batches)."""
    if fmt == "otlp-proto":
        otlp.read_otlp_proto(inputs.read_all(src, limit), src.name, out)
        return
    for line, doc in inputs.documents(src, limit):
        where = src.name if line == 0 else f"{src.name}: line {line}"
        if fmt == "jaeger" and doc.find(b'"resourceSpans"', 0, 4096) >= 0:
            otlp.read_otlp_json(doc, where, out)  # Jaeger's API v3 answers OTLP
        elif fmt == "jaeger" and split is None:
            if not jaeger.read_jaeger_doc(doc, where, out):
                _not_jaeger(where)
        elif fmt == "jaeger":
            assert split is not None
            split.extend(jaeger.jaeger_traces(doc, where) or _not_jaeger(where))
        else:
            READERS[fmt](doc, where, out)


@dataclass
class _Task:
    """One unit of parallel work: files (names; ``-`` for stdin), or Jaeger traces cut out of
    one document ``where``: their byte ranges in that file when it is a plain file, else their
    bytes."""

    files: list[str] = field(default_factory=list)
    raws: list[bytes] = field(default_factory=list)
    ranges: list[tuple[int, int]] = field(default_factory=list)
    where: str = ""
    size: int = 0


@contextmanager
def _no_gc() -> Iterator[None]:
    """Cyclic garbage collection paused: decoding makes millions of small acyclic objects,
    and the collector's passes over them cost more than the decoding (measured ×2.5)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run_task(
    task: _Task, fmt: str, options: SpanOptions
) -> tuple[Paired, ImportReport, _HeldPart | None]:
    """Decode and pair one task (in a worker). Rows of partial traces are handed back,
    compacted."""
    with _no_gc():
        paired, rep, held = _decode_and_pair(task, fmt, options)
        return paired, rep, _HeldPart.of(held) if held else None


def _decode_and_pair(
    task: _Task, fmt: str, options: SpanOptions
) -> tuple[Paired, ImportReport, list[decode.Row]]:
    rep = ImportReport("", fmt)
    whole = decode.SpanRows()
    held: list[decode.Row] = []
    for name in task.files:
        src = inputs.Source(name)
        rows = decode.SpanRows()
        rows.jaeger, rows.nodes = whole.jaeger, whole.nodes  # one table of the task's traces
        _read_source(src, fmt, options.max_document_bytes, rows, None)
        whole.jaeger = rows.jaeger
        (whole.rows if rows.complete else held).extend(rows.rows)
    for i, raw in enumerate(task.raws):
        jaeger.read_jaeger_trace(raw, f"{task.where}: trace {i}", whole)
    if task.ranges:  # one read of the file for the task's traces
        lo, hi = task.ranges[0][0], task.ranges[-1][1]
        data = inputs.read_range(task.where, lo, hi)
        for i, (a, b) in enumerate(task.ranges):
            jaeger.read_jaeger_trace(data[a - lo : b - lo], f"{task.where}: trace {i}", whole)
    parts = [pair_rows(whole.rows, rep, options)] if whole.rows else []
    if whole.jaeger is not None:
        parts.append(pair_rows(whole.jaeger, rep, options))
    paired = concat(parts) if parts else pair_rows([], rep, options)
    # nodes of every source read, also of rows held back for later pairing
    return replace(paired, nodes={**whole.nodes, **paired.nodes}), rep, held


#: Beyond this many inputs, files are not looked at one by one (a stat of every one of 50 000
#: files cost seconds): tasks take a fixed number of files, guessed at ~20 spans each.
_MANY_FILES = 64


def _tasks(
    head: list[inputs.Source], rest: Iterator[inputs.Source], fmt: str, options: SpanOptions
) -> Iterator[_Task]:
    """Cut the input (the sources ``head``, then ``rest``) into tasks of about
    ``batch_spans`` spans (guessed from file sizes, ~500 B of JSON per span, or from the file
    count); a large Jaeger document is cut into its traces."""
    budget = options.batch_spans * 500
    if len(head) > _MANY_FILES:
        names = (s.name for s in chain(head, rest))
        while chunk := list(islice(names, _per_task(options))):
            yield _Task(files=chunk)
        return
    task = _Task()
    for src in chain(head, rest):
        size = _size_of(src)
        big = src.is_stdin or size > budget
        if fmt == "jaeger" and big and b'"resourceSpans"' not in inputs.head(src):
            if task.files:
                yield task
                task = _Task()
            yield from _cut(src, options)
            continue
        task.files.append(src.name)
        task.size += size
        if task.size >= budget:
            yield task
            task = _Task()
    if task.files:
        yield task


def _cut(src: inputs.Source, options: SpanOptions) -> Iterator[_Task]:
    """A large Jaeger document cut into tasks of its traces: their byte ranges when it is a
    plain file holding one document (the workers read them: the document is not sent through
    a pipe), else their bytes."""
    budget = options.batch_spans * 500
    data = None if src.is_stdin else inputs.read_plain(src, options.max_document_bytes)
    if data is not None and next(islice(inputs.split_documents(data, src.name), 1, 2), None):
        data = None  # JSON Lines: cut line by line below
    raws: list[Any] = []
    if data is not None:
        parts, part, at = [], _Task(where=src.name), 0
        for raw in jaeger.jaeger_traces(data, src.name) or _not_jaeger(src.name):
            at = data.find(raw, at)  # each trace right after the one before: no search
            part.ranges.append((at, at + len(raw)))
            part.size += len(raw)
            at += len(raw)
            if part.size >= budget:
                parts.append(part)
                part = _Task(where=src.name)
        del data  # cut: not held while its parts are read
        yield from [*parts, part] if part.ranges else parts
        return
    _read_source(src, "jaeger", options.max_document_bytes, decode.SpanRows(), raws)
    part = _Task(where=src.name)
    for i, raw in enumerate(raws):
        part.raws.append(bytes(raw))  # copied one part at a time
        raws[i] = None
        part.size += len(part.raws[-1])
        if part.size >= budget:
            yield part
            part = _Task(where=src.name)
    if part.raws:
        yield part


def _not_jaeger(where: str) -> NoReturn:
    raise TraceFormatError(
        f"{where}: not Jaeger JSON (expected an object with a 'data' list of traces)"
    )


def _per_task(options: SpanOptions) -> int:
    return max(1, options.batch_spans // 20)


def _size_of(src: inputs.Source) -> int:
    try:
        return 0 if src.is_stdin else os.stat(src.name).st_size
    except OSError as e:
        raise TraceFormatError(f"{src.name}: cannot read ({e.strerror})") from None


@dataclass
class _HeldPart:
    """Span rows of partial traces, compact: ids as bytes arrays, names as codes into
    ``names`` (about 120 B a span instead of ~400 B as Python tuples)."""

    cols: dict[str, Any]
    names: list[str]

    @staticmethod
    def of(rows: Sequence[decode.Row]) -> _HeldPart:
        t, sp, par, svc, kind, start, dur, req, resp, peer, proto = zip(*rows, strict=True)
        nmap: dict[str, int] = {}
        code = nmap.setdefault

        def ids(col: Sequence[str]) -> Any:
            return np.array([x.encode() for x in col], dtype=bytes)

        return _HeldPart(
            {
                "trace": ids(t),
                "span": ids(sp),
                "parent": ids(par),
                "svc": np.fromiter((code(x, len(nmap)) for x in svc), np.int32, len(rows)),
                "peer": np.fromiter((code(x, len(nmap)) for x in peer), np.int32, len(rows)),
                "kind": np.array(kind, dtype=np.int8),
                "start": np.array(start, dtype=np.int64),
                "dur": np.array(dur, dtype=np.int64),
                "req": np.array(req, dtype=np.float64),
                "resp": np.array(resp, dtype=np.float64),
                "proto": np.array(proto, dtype=np.int8),
            },
            list(nmap),
        )


class _Held:
    """Partial traces' rows until the input ends, then whole traces batch by batch."""

    def __init__(self) -> None:
        self.parts: list[dict[str, Any]] = []
        self.names: dict[str, int] = {}

    def add(self, part: _HeldPart) -> None:
        remap = np.array([self.names.setdefault(n, len(self.names)) for n in part.names])
        cols = dict(part.cols)
        cols["svc"] = remap[cols["svc"]]
        cols["peer"] = remap[cols["peer"]]
        self.parts.append(cols)

    def batches(self, size: int) -> Iterator[list[decode.Row]]:
        if not self.parts:
            return
        cols = {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
        self.parts = []
        order = np.argsort(cols["trace"], kind="stable")
        cols = {k: v[order] for k, v in cols.items()}
        names = list(self.names)
        trace = cols["trace"]
        n, start = trace.size, 0
        while start < n:
            end = min(start + max(size, 1), n)
            while end < n and trace[end] == trace[end - 1]:
                end += 1
            sl = slice(start, end)

            def text(k: str, sl: slice = sl) -> list[str]:
                return [x.decode() for x in cols[k][sl].tolist()]

            yield list(
                zip(
                    text("trace"),
                    text("span"),
                    text("parent"),
                    [names[i] for i in cols["svc"][sl].tolist()],
                    cols["kind"][sl].tolist(),
                    cols["start"][sl].tolist(),
                    cols["dur"][sl].tolist(),
                    cols["req"][sl].tolist(),
                    cols["resp"][sl].tolist(),
                    [names[i] for i in cols["peer"][sl].tolist()],
                    cols["proto"][sl].tolist(),
                    strict=True,
                )
            )
            start = end


class _Seen:
    """The graph names of earlier batches, as their hashes, sorted (8 B a graph: a set of
    them took ~60 B)."""

    def __init__(self) -> None:
        self.hashes = np.zeros(0, dtype=np.int64)

    def add(self, names: Sequence[str]) -> int:
        """How many of ``names`` earlier batches had; then they are had too."""
        h = np.sort(np.fromiter(map(hash, names), dtype=np.int64, count=len(names)))
        at = np.searchsorted(self.hashes, h)
        met = 0
        if self.hashes.size:
            met = int((self.hashes[np.minimum(at, self.hashes.size - 1)] == h).sum())
        self.hashes = np.insert(self.hashes, at, h)
        return met


def _several_tasks(head: list[inputs.Source], options: SpanOptions) -> bool:
    """Whether the input makes more than one task (decided before reading, so the workers
    are forked while this process is still small): ``head`` is the input's first
    :func:`_head_size` sources (all of them when fewer)."""
    if len(head) > _MANY_FILES:
        return len(head) > _per_task(options)
    budget = options.batch_spans * 500
    return any(s.is_stdin for s in head) or sum(map(_size_of, head)) > budget


def _head_size(options: SpanOptions) -> int:
    return max(_MANY_FILES, _per_task(options)) + 1


def _workers(options: SpanOptions) -> int:
    if options.workers is not None:
        return max(1, options.workers)
    return max(1, min(2, len(os.sched_getaffinity(0))))


#: tasks sent ahead per worker: they read while the caller starts up (its imports, numba's
#: kernel, the profile: ~0.6 s, ~7 tasks a worker) and while it uses a batch; memory holds at
#: most this many batches (~2 MB each) not yet taken
AHEAD_PER_WORKER = 8
_Result = tuple[Paired, ImportReport, _HeldPart | None]


class Reading(Iterator[Paired]):
    """Paired call-graph batches of span files (see the module doc), read from construction
    on: the workers are forked and the first tasks sent before it returns, so they read while
    the caller prepares (imports, a profile). Iterating gives the batches in input order;
    counts go to ``report``. :meth:`close` (or a with block) stops the workers before the
    input's end. With ``options.rate`` None, ``batch.rate`` is NaN until
    :func:`~meshtax.traces.spans.fill_rates` has seen every batch."""

    def __init__(
        self,
        paths: inputs.PathIn | Sequence[inputs.PathIn],
        format: str,
        options: SpanOptions,
        report: ImportReport,
    ) -> None:
        if format not in FORMATS:
            raise TraceFormatError(f"format {format!r}: expected one of {', '.join(FORMATS)}")
        self.format, self.options, self.report = format, options, report
        self._held, self._seen, self._split = _Held(), _Seen(), 0
        self._pool: ProcessPoolExecutor | None = None
        self._queue: deque[Future[_Result]] = deque()
        sources = inputs.iter_sources(paths)
        head = list(islice(sources, _head_size(options)))
        n = _workers(options) if _several_tasks(head, options) else 1  # a pool pays from two on
        self._ahead = AHEAD_PER_WORKER * n
        if n > 1:
            import multiprocessing as mp

            self._pool = ProcessPoolExecutor(n, mp_context=mp.get_context("fork"))
            self._pool.submit(int)  # the workers forked now, before a large document is read here
        self._tasks = _tasks(head, sources, format, options)
        try:
            self._send()
        except BaseException:
            self.close()
            raise
        self._batches = self._run()

    def _send(self) -> None:
        """Tasks to the workers until :data:`AHEAD_PER_WORKER` a worker are not yet taken."""
        if self._pool is None:
            return
        while len(self._queue) < self._ahead and (t := next(self._tasks, None)) is not None:
            self._queue.append(self._pool.submit(_run_task, t, self.format, self.options))

    def _take(self, p: Paired, rep: ImportReport, part: _HeldPart | None) -> Paired:
        self.report.add(rep)
        if part is not None:
            self._held.add(part)
        self._split += self._seen.add(p.batch.graph_names)
        return p

    def _run(self) -> Iterator[Paired]:
        if self._pool is None:
            for t in self._tasks:
                yield self._take(*_run_task(t, self.format, self.options))
        while self._queue:
            got = self._queue.popleft().result()
            self._send()
            yield self._take(*got)
        self.close()
        # partial traces (OTLP batches, flat Zipkin lists): whole once every file is read
        for rows in self._held.batches(self.options.batch_spans):
            rep = ImportReport("", self.format)
            with _no_gc():
                part = pair_rows(rows, rep, self.options)
            yield self._take(part, rep, None)
        if self._split:
            self.report.notes["trace ids met again in a later batch: separate graphs"] += (
                self._split
            )

    def __next__(self) -> Paired:
        return next(self._batches)

    def close(self) -> None:
        """Stop: tasks not started are dropped, the workers end after their current one."""
        pool, self._pool = self._pool, None
        self._queue.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_batches(
    paths: inputs.PathIn | Sequence[inputs.PathIn],
    format: str,
    options: SpanOptions,
    report: ImportReport,
) -> Iterator[Paired]:
    """The batches of a :class:`Reading`, which starts when the first batch is asked for."""
    with Reading(paths, format, options, report) as reading:
        yield from reading


def concat(parts: Sequence[Paired]) -> Paired:
    """One batch of all graphs of ``parts`` (services and sidecars merged by name)."""
    if len(parts) == 1:
        return parts[0]
    services: dict[str, int] = {}
    specs: dict[Any, int] = {}
    cols: dict[str, list[Any]] = {k: [] for k in ("parent", "caller", "callee", "cs", "es")}
    ptr = [np.zeros(1, dtype=np.int64)]
    base = 0
    for p in parts:
        b = p.batch
        smap = np.array([services.setdefault(s, len(services)) for s in b.services] + [-1])
        pmap = np.array([specs.setdefault(s, len(specs)) for s in b.specs] + [-1])
        cols["parent"].append(np.where(b.parent >= 0, b.parent + base, -1))
        cols["caller"].append(smap[b.caller])
        cols["callee"].append(smap[b.callee])
        cols["cs"].append(pmap[b.caller_spec])
        cols["es"].append(pmap[b.callee_spec])
        ptr.append(b.graph_ptr[1:] + base)
        base += b.n_invocations

    def cat(name: str, dtype: Any) -> Any:
        return np.concatenate([getattr(p.batch, name) for p in parts]).astype(dtype)

    def i64(k: str) -> Any:
        return np.concatenate(cols[k]).astype(np.int64)

    protos = [
        p.batch.protocol
        if p.batch.protocol is not None
        else np.zeros(p.batch.n_invocations, dtype=np.int64)
        for p in parts
    ]
    proto = np.concatenate(protos).astype(np.int64)
    batch = EcgBatch(
        graph_ptr=np.concatenate(ptr).astype(np.int64),
        parent=i64("parent"),
        caller=i64("caller"),
        callee=i64("callee"),
        caller_spec=i64("cs"),
        callee_spec=i64("es"),
        request_bytes=cat("request_bytes", np.float64),
        response_bytes=cat("response_bytes", np.float64),
        rate=cat("rate", np.float64),
        start_us=cat("start_us", np.float64),
        duration_us=cat("duration_us", np.float64),
        services=tuple(services),
        specs=tuple(specs),
        graph_names=tuple(n for p in parts for n in p.batch.graph_names),
        row_ids=tuple(i for p in parts for i in p.batch.row_ids),
        protocol=proto if proto.any() else None,
    )
    nodes: dict[str, str] = {}
    for p in parts:
        for k, v in p.nodes.items():
            nodes.setdefault(k, v)
    return Paired(
        batch,
        np.concatenate([p.origin_ns for p in parts]).astype(np.int64),
        np.concatenate([p.end_ns for p in parts]).astype(np.int64),
        np.concatenate([p.asynchronous for p in parts]).astype(bool),
        nodes,
    )


def load_paired(
    paths: inputs.PathIn | Sequence[inputs.PathIn], format: str, options: SpanOptions
) -> tuple[Paired, ImportReport]:
    """Every graph of the span files in one columnar batch, rates filled in."""
    rep = ImportReport(", ".join(os.fspath(p) for p in _as_list(paths)), format)
    parts = list(iter_batches(paths, format, options, rep))
    if options.rate is None:
        fill_rates(parts, options.window_s, rep)
    paired = concat(parts) if parts else pair_rows([], rep, options)
    return replace(paired, batch=with_nodes(paired, options)), rep


def with_nodes(paired: Paired, options: SpanOptions) -> EcgBatch:
    """The batch with each service's node (``k8s.node.name``/``host.name`` of its resource,
    under the service's mapped name)."""
    rename = naming(options).rename
    by_name: dict[str, str] = {}
    for raw, node in paired.nodes.items():
        by_name.setdefault(rename(raw), node)
    b = paired.batch
    names = tuple(dict.fromkeys(by_name[s] for s in b.services if s in by_name))
    ix = {n: k for k, n in enumerate(names)}
    where = [ix[by_name[s]] if s in by_name else -1 for s in b.services]
    return replace(b, service_node=np.asarray(where, dtype=np.int64), node_names=names)


def _as_list(paths: inputs.PathIn | Sequence[inputs.PathIn]) -> list[inputs.PathIn]:
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
