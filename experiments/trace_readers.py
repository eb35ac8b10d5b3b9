"""Rust- and C++-backed JSON readers against meshtax's Jaeger reader on per-trace files (#16).

    .venv/bin/python experiments/trace_readers.py DIR [--files 10000]

DIR holds one Jaeger query-API document per trace (``benchmarks/bench_traces.py --keep``
writes them to ``DIR/<n>/files``). Each reader that is installed (DuckDB, Polars, pyarrow:
none is a meshtax dependency; install them in a scratch venv) reads the same files into span
rows, timed in this process (CPU and wall, one run each), next to meshtax's path
(``meshtax.traces.stream.iter_batches``, one worker): read, decode, spans to columns and
pairing. The readers are given only what they must read; the schema is Jaeger's (tags'
values mixed strings and numbers, processes a map keyed by id).
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshtax.traces.report import ImportReport
from meshtax.traces.spans import SpanOptions
from meshtax.traces.stream import iter_batches

SPAN = (
    "STRUCT(spanID VARCHAR, startTime BIGINT, duration BIGINT, processID VARCHAR, "
    '"references" STRUCT(refType VARCHAR, spanID VARCHAR)[], '
    'tags STRUCT("key" VARCHAR, "value" JSON)[])'
)
TRACE = f"STRUCT(traceID VARCHAR, spans {SPAN}[], processes MAP(VARCHAR, JSON))"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def duckdb_spans(files: list[Path]) -> int:
    duckdb: Any = importlib.import_module("duckdb")
    con = duckdb.connect()
    con.execute("SET threads = 1")
    listing = ", ".join(f"'{f}'" for f in files)
    q = (
        f"SELECT count(*) FROM (SELECT unnest(t.spans) AS s FROM (SELECT unnest(data) AS t "
        f"FROM read_json([{listing}], format = 'unstructured', "
        f"columns = {{'data': '{TRACE}[]'}})))"
    )
    return int(con.execute(q).fetchone()[0])


def polars_spans(files: list[Path]) -> int:
    pl: Any = importlib.import_module("polars")
    buf = b"\n".join(f.read_bytes() for f in files)  # each file is one line of JSON
    tag = pl.Struct({"key": pl.String, "value": pl.String})
    ref = pl.Struct({"refType": pl.String, "spanID": pl.String})
    span = pl.Struct(
        {
            "spanID": pl.String,
            "startTime": pl.Int64,
            "duration": pl.Int64,
            "processID": pl.String,
            "references": pl.List(ref),
            "tags": pl.List(tag),
        }
    )
    schema = {"data": pl.List(pl.Struct({"traceID": pl.String, "spans": pl.List(span)}))}
    df = pl.read_ndjson(buf, schema=schema)
    return int(df.explode("data").unnest("data").explode("spans").height)


def pyarrow_spans(files: list[Path]) -> int:
    pj: Any = importlib.import_module("pyarrow.json")
    io = importlib.import_module("io")
    buf = b"\n".join(f.read_bytes() for f in files)
    table = pj.read_json(io.BytesIO(buf))
    return int(table.num_rows)


def meshtax_spans(files: list[Path]) -> int:
    rep = ImportReport("", "jaeger")
    for _ in iter_batches([str(f) for f in files], "jaeger", SpanOptions(rate=1, workers=1), rep):
        pass
    return rep.rows_read


READERS: dict[str, Callable[[list[Path]], int]] = {
    "meshtax (msgspec, columns, pairing)": meshtax_spans,
    "duckdb read_json": duckdb_spans,
    "polars read_ndjson": polars_spans,
    "pyarrow.json read_json": pyarrow_spans,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--files", type=int, default=10_000)
    a = ap.parse_args()
    files = sorted(a.dir.iterdir())[: a.files]
    print(f"{len(files)} files, {sum(os.path.getsize(f) for f in files) / 1e6:.0f} MB")
    for name, read in READERS.items():
        t0, c0 = time.perf_counter(), _cpu()
        try:
            spans = read(files)
        except ImportError as e:
            print(f"{name}: not installed ({e.name})")
            continue
        except Exception as e:  # a reader that refuses the documents: what it said
            print(f"{name}: fails: {type(e).__name__}: {str(e)[:160]}")
            continue
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        print(f"{name}: {spans} spans, {wall:.2f} s wall, {cpu:.2f} s CPU, "
              f"{cpu / max(spans, 1) * 1e6:.2f} µs CPU a span")  # fmt: skip


if __name__ == "__main__":
    main()
