"""Trace inputs as users have them: files, directories, globs, ``-`` (stdin), gzip or zstd.

:func:`expand` turns what the user named into a sorted list of sources; :func:`documents`
reads one source into JSON documents: the whole file, or one document per line when the file
is JSON Lines (as the OpenTelemetry Collector's and SDKs' file exporters write). Every read
is bounded: a document (decompressed) larger than ``max_bytes`` is refused, never loaded.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import re
import stat
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from meshtax import safeio
from meshtax.traces.errors import TraceFormatError

PathIn = str | os.PathLike[str]
STDIN = "-"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: The largest document (one file, or one line of JSON Lines) read into memory, decompressed:
#: a decoded document takes a few times its size, so larger inputs must come as JSON Lines,
#: several files, or (Jaeger) traces that are cut out of the document one batch at a time.
MAX_DOCUMENT_BYTES = 256 << 20


@dataclass(frozen=True)
class Source:
    """One input: a file path, or ``-`` for standard input."""

    name: str

    @property
    def is_stdin(self) -> bool:
        return self.name == STDIN


def expand(paths: PathIn | Sequence[PathIn]) -> list[Source]:
    """Files named, files under directories (recursively, sorted, hidden ones skipped), glob
    matches (``*``, ``?``, ``[``; ``**`` recursive), and ``-`` for stdin, in the order given."""
    return list(iter_sources(paths))


def iter_sources(paths: PathIn | Sequence[PathIn]) -> Iterator[Source]:
    """:func:`expand`, one source at a time (a directory of 200 000 files is not held as
    200 000 paths: only its sorted names while it is walked)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise TraceFormatError("no input files")
    for item in items:
        s = os.fspath(item)
        p = Path(s)
        if s == STDIN:
            yield Source(STDIN)
        elif p.is_dir():
            found = False
            for f in _walk(s):
                found = True
                yield Source(f)
            if not found:
                raise TraceFormatError(f"{p}: directory holds no files")
        elif p.exists():
            safeio.check_regular(s, "a trace file")  # a FIFO or device would block or never end
            yield Source(s)
        elif any(c in s for c in "*?["):
            hits = sorted(h for h in glob.glob(s, recursive=True) if Path(h).is_file())
            if not hits:
                raise TraceFormatError(f"{s}: no file matches")
            yield from (Source(h) for h in hits)
        else:
            raise TraceFormatError(f"{s}: no such file")


def _walk(top: str) -> Iterator[str]:
    """Regular files below ``top`` (symbolic links to files followed, to directories not, as
    ``os.walk``), in the order of their sorted paths: a directory ``d`` sorts as ``d/``.
    A directory's sorted names are kept as one string while it is walked (~40 B a file, not
    a list of ~160 B a file)."""
    names: list[str] = []
    try:
        with os.scandir(top) as it:
            for e in it:
                if e.name.startswith("."):
                    continue
                if e.is_dir():
                    if not e.is_symlink():
                        names.append(e.name + "/")
                elif e.is_file():  # d_type: no stat, except for symbolic links
                    names.append(e.name)
    except OSError:
        return  # as os.walk: a directory that cannot be listed holds nothing
    names.sort()
    packed = "\0".join(names)  # a name never holds NUL
    del names
    prefix = os.path.join(top, "")
    at = 0
    while at < len(packed):
        end = packed.find("\0", at)
        end = len(packed) if end < 0 else end
        name = packed[at:end]
        at = end + 1
        if name[-1] == "/":
            yield from _walk(prefix + name[:-1])
        else:
            yield prefix + name


class _Limited:
    """A binary stream that refuses to give more than ``limit`` bytes in one document."""

    def __init__(self, raw: IO[bytes], name: str) -> None:
        self.raw = raw
        self.name = name

    def _guard(self, fn: object, *a: int) -> bytes:
        try:
            return fn(*a)  # type: ignore[operator,no-any-return]
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise TraceFormatError(
                f"{self.name}: cannot read: corrupt or truncated gzip ({e})"
            ) from None
        except OSError as e:
            raise TraceFormatError(f"{self.name}: cannot read ({e}; truncated file?)") from None
        except Exception as e:  # zstandard.ZstdError has no common base to name
            if type(e).__name__ == "ZstdError":
                raise TraceFormatError(f"{self.name}: cannot read zstd ({e})") from None
            raise

    def read(self, n: int) -> bytes:
        return self._guard(self.raw.read, n)

    def readline(self, n: int) -> bytes:
        return self._guard(self.raw.readline, n)


def _open(src: Source) -> IO[bytes]:
    if src.is_stdin:
        f: IO[bytes] = sys.stdin.buffer
    else:
        try:
            f = open(src.name, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as e:
            raise TraceFormatError(f"{src.name}: cannot open ({e.strerror})") from None
    if not isinstance(f, io.BufferedReader):
        f = io.BufferedReader(f)  # type: ignore[type-var]
    head = f.peek(4)[:4]
    if head[:2] == GZIP_MAGIC:
        if src.is_stdin:
            return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
        f.close()  # reopened by gzip, which then owns (and closes) the file
        return gzip.open(src.name, "rb")  # type: ignore[return-value]
    if head == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raise TraceFormatError(
                f"{src.name}: zstd-compressed; reading it needs the zstandard package"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        return io.BufferedReader(reader)
    return f


def head(src: Source, n: int = 4096) -> bytes:
    """The first ``n`` decompressed bytes (for format detection). Stdin is not consumed: its
    bytes are kept for :func:`documents` (see :func:`_stdin_buffer`)."""
    if src.is_stdin:
        return _stdin_buffer()[:n]
    f = _open(src)
    try:
        return _Limited(f, src.name).read(n)
    finally:
        f.close()


_STDIN_DATA: list[bytes] = []


def _stdin_buffer(limit: int = MAX_DOCUMENT_BYTES, keep: bool = True) -> bytes:
    """Stdin read once (bounded; decompressed) and kept until it is read for its documents
    (``keep=False``), so it can be sniffed first."""
    if not _STDIN_DATA:
        f = _open(Source(STDIN))
        data = _Limited(f, "<stdin>").read(limit + 1)
        if len(data) > limit:
            raise TraceFormatError(f"<stdin>: more than {limit} bytes; pass a file instead")
        _STDIN_DATA.append(data)
    return _STDIN_DATA[0] if keep else _STDIN_DATA.pop()


def read_all(src: Source, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The whole (decompressed) source, refused beyond ``limit`` bytes."""
    if src.is_stdin:
        return _stdin_buffer(limit, keep=False)
    f = _open(src)
    try:
        data = _Limited(f, src.name).read(limit + 1)
    finally:
        f.close()
    if len(data) > limit:
        raise TraceFormatError(
            f"{src.name}: one document of more than {limit} bytes (decompressed); split it, "
            "or write JSON Lines (one document per line)"
        )
    return data


_BLANK = re.compile(rb"\s*")
_TEXT = re.compile(rb"\S")


def split_documents(data: bytes, name: str) -> Iterator[tuple[int, bytes]]:
    """The documents of a file read whole: itself, or its lines when it is JSON Lines (looked
    at without copying the document: most files are one small document)."""
    start = _BLANK.match(data).end()  # type: ignore[union-attr]  # matches the empty string
    if start == len(data):
        raise TraceFormatError(f"{name}: empty file")
    nl = data.find(b"\n", start)
    if nl < 0 or _TEXT.search(data, nl) is None:  # one line, maybe blank lines after it
        yield 0, data
        return
    first = data[start:nl].strip()
    one_line = first[:1] in (b"{", b"[") and first[-1:] in (b"}", b"]") and len(first) > 1
    if not one_line:
        yield 0, data
        return
    for i, line in enumerate(data.split(b"\n"), 1):
        if line.strip():
            yield i, line


def read_plain(src: Source, limit: int) -> bytes | None:
    """The bytes of an uncompressed regular file of at most ``limit`` bytes, in one read (the
    common case, kept short: 50 000 small files are read per import); None for anything
    else."""
    try:
        fd = os.open(src.name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise TraceFormatError(f"{src.name}: cannot read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if st.st_size > limit or not stat.S_ISREG(st.st_mode):
            return None
        data = os.read(fd, st.st_size + 1)  # one more: a file that grew is read the long way
        if len(data) != st.st_size or data[:2] == GZIP_MAGIC or data[:4] == ZSTD_MAGIC:
            return None
        return data
    except OSError as e:
        raise TraceFormatError(f"{src.name}: cannot read ({e.strerror})") from None
    finally:
        os.close(fd)


def read_range(name: str, lo: int, hi: int) -> bytes:
    """Bytes ``lo`` to ``hi`` of a plain file (a part of a document cut where it was read)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise TraceFormatError(f"{name}: cannot read ({e.strerror})") from None
    try:
        parts, at = [], lo
        while at < hi:
            got = os.pread(fd, hi - at, at)
            if not got:
                raise TraceFormatError(f"{name}: shorter than when it was cut (changed?)")
            parts.append(got)
            at += len(got)
        return b"".join(parts)
    except OSError as e:
        raise TraceFormatError(f"{name}: cannot read ({e.strerror})") from None
    finally:
        os.close(fd)


def documents(src: Source, limit: int = MAX_DOCUMENT_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each JSON document of a source: ``(0, whole file)`` for a
    multi-line document, else one per non-empty line (JSON Lines; a one-line file is one).
    A document larger than ``limit`` bytes is refused."""
    name = "<stdin>" if src.is_stdin else src.name
    if not src.is_stdin:
        data = read_plain(src, limit)
        if data is not None:  # a plain file that fits: cut into lines only if JSON Lines
            yield from split_documents(data, name)
            return
    f: IO[bytes] = io.BytesIO(_stdin_buffer(limit, keep=False)) if src.is_stdin else _open(src)
    try:
        r = _Limited(f, name)
        first = r.readline(limit + 1)
        while first and not first.strip():
            first = r.readline(limit + 1)
        if not first:
            raise TraceFormatError(f"{name}: empty file")
        if len(first) > limit:
            raise TraceFormatError(
                f"{name}: a line of more than {limit} bytes (decompressed); split the file"
            )
        s = first.strip()
        one_line = s[:1] in (b"{", b"[") and s[-1:] in (b"}", b"]") and len(s) > 1
        if not one_line:
            try:  # read it whole in one buffer (no copy of first + rest)
                f.seek(0)
                doc = r.read(limit + 1)
            except (OSError, ValueError):
                doc = first + r.read(limit + 1 - len(first))
            if len(doc) > limit:
                raise TraceFormatError(
                    f"{name}: one document of more than {limit} bytes (decompressed); split "
                    "it, or write JSON Lines (one document per line)"
                )
            yield 0, doc
            return
        yield 1, first
        lineno = 1
        while True:
            line = r.readline(limit + 1)
            if not line:
                return
            lineno += 1
            if len(line) > limit:
                raise TraceFormatError(f"{name}: line {lineno}: more than {limit} bytes")
            if line.strip():
                yield lineno, line
    finally:
        if not src.is_stdin:
            f.close()
