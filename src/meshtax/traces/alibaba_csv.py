"""The Alibaba call-graph CSV schemas (v2021 ``MSCallGraph``, v2022 ``CallGraph``): options,
version sniffing, column checks and streaming the rows as normalized string tables through
:mod:`meshtax.safeio` (malformed rows counted, corrupt files a :class:`TraceFormatError`)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pcsv

from meshtax import safeio
from meshtax.errors import InputError
from meshtax.model.ecg import DEFAULT_MESSAGE_BYTES, DEFAULT_RATE_RPS
from meshtax.model.sidecar import SidecarConfig
from meshtax.traces.errors import TraceFormatError as TraceFormatError  # re-exported
from meshtax.traces.report import ImportReport

Version = Literal["alibaba-v2021", "alibaba-v2022"]
Orphans = Literal["attach", "drop-rows", "drop-graph"]

V2021_COLUMNS = ("traceid", "timestamp", "rpcid", "um", "rpctype", "dm", "interface", "rt")
V2022_COLUMNS = (
    "timestamp",
    "traceid",
    "service",
    "rpc_id",
    "rpctype",
    "um",
    "uminstanceid",
    "interface",
    "dm",
    "dminstanceid",
    "rt",
)
# normalized name ← source column, per version
_MAP: dict[str, dict[str, str]] = {
    "alibaba-v2021": {
        "trace": "traceid",
        "ts": "timestamp",
        "rpcid": "rpcid",
        "um": "um",
        "dm": "dm",
        "rpctype": "rpctype",
        "rt": "rt",
    },
    "alibaba-v2022": {
        "trace": "traceid",
        "ts": "timestamp",
        "rpcid": "rpc_id",
        "um": "um",
        "dm": "dm",
        "rpctype": "rpctype",
        "rt": "rt",
    },
}
_MISSING_NAMES = ("", "(?)", "?", "NAN", "NaN", "nan", "UNKNOWN", "UNAVAILABLE", "null", "NULL")
_EXTERNAL_NAMES = ("USER",)
UNKNOWN_SERVICE = "(unknown)"
_NUM = r"^\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$"
#: beyond these a timestamp or rt (ms) is not a time: the row is dropped (counted)
MAX_TIMESTAMP_MS = 1e13
MAX_RT_MS = 1e9


@dataclass(frozen=True)
class AlibabaOptions:
    """Options of the Alibaba readers.

    ``request_bytes``/``response_bytes``/``rate``: values for every call (absent in the traces).
    ``sidecar``: configuration recorded for every service (the study replaces it).
    ``unmeshed_types``: rpctypes whose callee has no sidecar (e.g. ``{"mc", "db"}``); by
    default every callee is meshed, as in the paper's study.
    ``orphans``: what to do with rows whose parent rpcid is missing (see the module doc).
    ``partition_graphs``: graphs per yielded batch. ``bucket_bytes``: input bytes (uncompressed)
    per hash bucket; inputs below it are read in one piece.
    """

    request_bytes: float = DEFAULT_MESSAGE_BYTES
    response_bytes: float = DEFAULT_MESSAGE_BYTES
    rate: float = DEFAULT_RATE_RPS
    sidecar: SidecarConfig = SidecarConfig()
    unmeshed_types: frozenset[str] = frozenset()
    orphans: Orphans = "attach"
    partition_graphs: int = 100_000
    bucket_bytes: int = 256 << 20
    block_bytes: int = 16 << 20
    tmp_dir: str | None = None


def sniff_version(path: str | os.PathLike[str]) -> Version:
    """The schema of an Alibaba CSV from its header line."""
    header = _header(Path(path))
    cols = [c.strip() for c in header]
    if "rpc_id" in cols and "dminstanceid" in cols:
        return "alibaba-v2022"
    if "rpcid" in cols and "traceid" in cols:
        return "alibaba-v2021"
    raise TraceFormatError(
        f"{path}: header {','.join(cols)!r} is neither Alibaba v2021 ({','.join(V2021_COLUMNS)}) "
        f"nor v2022 ({','.join(V2022_COLUMNS)})"
    )


def _header(path: Path) -> list[str]:
    try:
        with safeio.open_stream(path, "an Alibaba trace CSV") as raw:
            line = raw.readline(1 << 16)
    except InputError as e:
        raise TraceFormatError(str(e), file=str(path)) from None
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror or e})") from None
    if not line.strip():
        raise TraceFormatError(f"{path}: empty file (expected a CSV header line)")
    try:
        return [c.strip().strip('"') for c in line.decode().rstrip("\r\n").split(",")]
    except UnicodeDecodeError:
        raise TraceFormatError(f"{path}: not a text CSV file") from None


def _check_columns(path: Path, header: list[str], version: Version) -> None:
    want = V2021_COLUMNS if version == "alibaba-v2021" else V2022_COLUMNS
    have = [c.strip() for c in header]
    missing = [c for c in _MAP[version].values() if c not in have]
    if missing:
        raise TraceFormatError(
            f"{path}: missing column(s) {', '.join(missing)} for {version}; expected header {','.join(want)} "
            f"(optionally with a leading index column), found {','.join(have)}"
        )


def _stream_tables(path: Path, version: Version, opts: AlibabaOptions) -> Iterator[pa.Table]:
    """Chunks of the file as normalized string tables (trace, ts, rpcid, um, dm, rpctype, rt)."""
    header = _header(path)
    _check_columns(path, header, version)
    names = [c.strip() or f"_index{i}" for i, c in enumerate(header)]
    m = _MAP[version]
    need = list(m.values())
    try:
        stream = safeio.open_stream(path, "an Alibaba trace CSV")
    except InputError as e:
        raise TraceFormatError(str(e), file=str(path)) from None
    try:
        quiet = _quiet_bad_rows()
        quiet.__enter__()
        reader = pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(
                column_names=names, skip_rows=1, block_size=opts.block_bytes
            ),
            parse_options=pcsv.ParseOptions(invalid_row_handler=_count_invalid),
            convert_options=pcsv.ConvertOptions(
                column_types={c: pa.string() for c in names},
                include_columns=need,
                strings_can_be_null=False,
            ),
        )
        for rb in reader:
            t = pa.Table.from_batches([rb])
            yield pa.table({k: t.column(v) for k, v in m.items()})
    except InputError as e:  # raised by the stream under pyarrow: decompression
        raise TraceFormatError(str(e), file=str(path)) from None
    except (pa.ArrowException, OSError, EOFError, ValueError) as e:
        why = _arrow_reason(e)
        raise TraceFormatError(
            f"{path}: unreadable ({why}); is the file truncated or not {version} CSV?",
            file=str(path),
        ) from None
    finally:
        quiet.__exit__(None, None, None)
        stream.close()


@contextlib.contextmanager
def _quiet_bad_rows() -> Iterator[None]:
    """pyarrow decodes a malformed row as UTF-8 to hand it to the invalid-row handler; when
    the row is not UTF-8 that fails inside pyarrow, which prints a traceback ("Exception
    ignored") and then fails the read, which we report cleanly. Keep the traceback quiet."""
    old = sys.unraisablehook

    def hook(u: Any) -> None:
        if isinstance(u.exc_value, UnicodeDecodeError) and u.object is _count_invalid:
            return
        old(u)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = old


def _arrow_reason(e: BaseException) -> str:
    """pyarrow's message without the Python traceback it appends for errors raised in a
    Python file object, and without quoting the data."""
    text = str(e).split("\n", 1)[0]
    if "InputError" in text or "zlib" in text or "decompress" in text.lower():
        return "corrupt or truncated compressed data"
    # "Expected 11 columns, got 10: <the row>": the row is the file's content, not quoted
    m = re.match(r"(.*?(?:columns?|fields?), got \d+)", text)
    if m:
        return m.group(1)
    return text.split(": ", 2)[0][:160] if len(text) > 160 else text


_INVALID_ROWS = [0]


def _count_invalid(row: Any) -> str:
    # rows with the wrong number of fields: counted, skipped (the count is read per file)
    _INVALID_ROWS[0] += 1
    return "skip"


def _flush_invalid(rep: ImportReport) -> None:
    if _INVALID_ROWS[0]:
        rep.dropped_rows["wrong number of fields"] += _INVALID_ROWS[0]
        rep.rows_read += _INVALID_ROWS[0]
        _INVALID_ROWS[0] = 0


def _empty_table() -> pa.Table:
    return pa.table(
        {
            k: pa.array([], pa.string())
            for k in ("trace", "ts", "rpcid", "um", "dm", "rpctype", "rt")
        }
    )
