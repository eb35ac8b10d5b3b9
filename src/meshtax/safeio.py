"""Safe reading of user files, for every layer: regular files only, size and decompression
limits, JSON without NaN/Infinity, YAML with an alias budget, nesting depth checked without
recursion. Every refusal is an :class:`~meshtax.errors.InputError` naming the file and the
limit; no message quotes the file's contents (it may be any file: meshtax often runs as root).

Limits are process-wide defaults (:class:`Limits`), raised by the CLI's ``--max-input-mb``
or ``$MESHTAX_MAX_INPUT_MB``, or for a block of code with :func:`use_limits`.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import yaml

from meshtax.errors import InputError

PathIn = str | os.PathLike[str]


@dataclass(frozen=True)
class Limits:
    """``max_bytes``: a document read whole (ECG, profile, speedup, manifest, configuration).
    ``max_ratio``/``min_decompressed``: a compressed stream may expand to
    ``max(min_decompressed, max_ratio × compressed size)`` (text compresses 5–10×; a bomb
    1000×). ``yaml_aliases``: aliases per YAML document; ``max_nodes``: values of a document
    with every alias expanded; ``max_depth``: nesting of lists and mappings."""

    max_bytes: int = 128 << 20
    max_ratio: float = 100.0
    min_decompressed: int = 64 << 20
    yaml_aliases: int = 100
    alias_values: int = 100_000
    max_depth: int = 100


def _env_limits() -> Limits:
    mb = os.environ.get("MESHTAX_MAX_INPUT_MB", "").strip()
    try:
        v = float(mb) if mb else 0.0
    except ValueError:
        v = 0.0
    return Limits(max_bytes=int(v * (1 << 20))) if math.isfinite(v) and v > 0 else Limits()


# Limits is frozen: sharing the default is safe
_LIMITS: ContextVar[Limits] = ContextVar("meshtax_limits", default=_env_limits())  # noqa: B039


def limits() -> Limits:
    """The limits in force."""
    return _LIMITS.get()


def set_limits(new: Limits) -> None:
    """Set the process-wide limits (the CLI does, from its options)."""
    _LIMITS.set(new)


@contextlib.contextmanager
def use_limits(**changes: Any) -> Iterator[Limits]:
    """Limits changed for the block: ``with use_limits(max_bytes=1 << 30): ...``."""
    token = _LIMITS.set(replace(_LIMITS.get(), **changes))
    try:
        yield _LIMITS.get()
    finally:
        _LIMITS.reset(token)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _os_error(path: str, what: str, e: OSError) -> InputError:
    reason = {
        "ENOENT": "file not found",
        "EACCES": "permission denied",
        "EISDIR": "is a directory",
        "ELOOP": "too many symbolic links",
        "ENAMETOOLONG": "name too long",
        "ENOTDIR": "a part of the path is not a directory",
    }.get(errno.errorcode.get(e.errno or 0, ""), e.strerror or e.__class__.__name__)
    if e.errno == errno.ENOENT:
        return InputError(f"{path}: file not found; expected {what}", file=path)
    return InputError(f"{path}: cannot read {what}: {reason}", file=path)


def check_regular(path: PathIn, what: str = "the file") -> os.stat_result:
    """``stat`` of a regular file (symbolic links followed); refuses directories, FIFOs,
    devices and sockets without opening them (opening a FIFO blocks)."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise _os_error(p, what, e) from None
    except ValueError:  # embedded NUL byte
        raise InputError(f"{p!r}: not a valid path", file=p) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p}: {_kind(st.st_mode)}; expected {what} as a regular file", file=p)
    return st


def open_regular(path: PathIn, what: str = "the file") -> IO[bytes]:
    """Open a regular file for binary reading. Opened non-blocking and checked with ``fstat``,
    so a path swapped for a FIFO after a check cannot block the reader."""
    p = os.fspath(path)
    check_regular(p, what)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _os_error(p, what, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{p}: {_kind(st.st_mode)}; expected {what} as a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: PathIn, what: str = "the file", max_bytes: int | None = None) -> bytes:
    """The whole file, refused beyond ``max_bytes`` (default: :attr:`Limits.max_bytes`)."""
    p = os.fspath(path)
    cap = limits().max_bytes if max_bytes is None else max_bytes
    with open_regular(p, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise InputError(_too_big(p, what, size, cap), file=p)
        try:
            data = f.read(cap + 1)
        except OSError as e:
            raise _os_error(p, what, e) from None
    if len(data) > cap:  # grew while we read it
        raise InputError(_too_big(p, what, len(data), cap), file=p)
    return data


def _too_big(p: str, what: str, size: int, cap: int) -> str:
    return (
        f"{p}: {_size(size)}, over the {_size(cap)} limit for {what}; "
        "raise it with --max-input-mb (or $MESHTAX_MAX_INPUT_MB) if the file is right"
    )


def decode_text(data: bytes, path: str, what: str = "the file") -> str:
    """UTF-8 text (a BOM is dropped); refuses binary data with the offset of the first bad byte."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{path}: not UTF-8 text (byte {e.start}); expected {what} as YAML or JSON text",
            file=path,
        ) from None
    if "\x00" in text:
        raise InputError(f"{path}: contains NUL bytes; expected {what} as text", file=path)
    return text


def read_text(path: PathIn, what: str = "the file", max_bytes: int | None = None) -> str:
    p = os.fspath(path)
    return decode_text(read_bytes(p, what, max_bytes), p, what)


# ---- compressed streams ------------------------------------------------------------------


class _Bounded(io.RawIOBase):
    """A decompressing reader that refuses to expand beyond a limit and turns every
    decompression failure into an :class:`InputError`."""

    def __init__(
        self, inner: IO[bytes], path: str, cap: int, compressed: int, raw: IO[bytes]
    ) -> None:
        self._inner = inner
        self._raw = raw
        self._path = path
        self._cap = cap
        self._compressed = compressed
        self.produced = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            data = self._inner.read(len(b))
        except (OSError, EOFError, zlib.error):
            raise InputError(
                f"{self._path}: corrupt or truncated gzip data; expected a complete .gz file",
                file=self._path,
            ) from None
        n = len(data)
        self.produced += n
        if self.produced > self._cap:
            raise InputError(
                f"{self._path}: expands beyond {_size(self._cap)} "
                f"({_size(self._compressed)} compressed): a decompression bomb or an unusually "
                "repetitive file; raise the limit with --max-input-mb if it is right",
                file=self._path,
            )
        b[:n] = data
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._inner.close()
        with contextlib.suppress(Exception):
            self._raw.close()
        super().close()


def is_gzip(path: PathIn) -> bool:
    with open_regular(path) as f:
        return f.read(2) == b"\x1f\x8b"


def open_stream(path: PathIn, what: str = "the file") -> IO[bytes]:
    """A buffered binary stream of a regular file, gunzipped if it starts with the gzip magic,
    with the decompression limit of :class:`Limits`. No limit on plain files (streams are
    read in bounded memory)."""
    p = os.fspath(path)
    f = open_regular(p, what)
    try:
        magic = f.read(2)
        f.seek(0)
    except OSError as e:
        f.close()
        raise _os_error(p, what, e) from None
    if magic != b"\x1f\x8b":
        return f
    lim = limits()
    compressed = os.fstat(f.fileno()).st_size
    cap = int(max(lim.min_decompressed, lim.max_ratio * compressed))
    gz: Any = gzip.GzipFile(fileobj=f, mode="rb")
    raw = _Bounded(gz, p, cap, compressed, f)
    return io.BufferedReader(raw, buffer_size=1 << 20)


# ---- documents ---------------------------------------------------------------------------


def _check_tree(doc: Any, path: str) -> None:
    """Nesting depth of parsed data, without recursion."""
    cap = limits().max_depth
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        x, d = stack.pop()
        if d > cap:
            raise InputError(
                f"{path}: nested more than {cap} levels deep; expected a flatter document",
                file=path,
            )
        if isinstance(x, dict):
            stack.extend((v, d + 1) for v in x.values() if isinstance(v, (dict, list)))
        elif isinstance(x, list):
            stack.extend((v, d + 1) for v in x if isinstance(v, (dict, list)))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, path: str, nonfinite: bool = False) -> Any:
    """JSON with the nesting limit; errors give line and column only. NaN/Infinity are
    refused, unless ``nonfinite`` (a schema checks the numbers next, and names the field)."""
    try:
        doc = json.loads(text, parse_constant=float if nonfinite else _no_constant)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}: line {e.lineno} column {e.colno}: JSON syntax error: {e.msg}", file=path
        ) from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply; expected a flatter document") from None
    except ValueError as e:  # NaN/Infinity, integers beyond Python's digit limit
        raise InputError(f"{path}: {_value_problem(e)}", file=path) from None
    _check_tree(doc, path)
    return doc


def _value_problem(e: ValueError | OverflowError) -> str:
    text = str(e)
    if "digits" in text:
        return "an integer with thousands of digits; expected a number of a sensible size"
    return text.splitlines()[0] if text else e.__class__.__name__


# PyYAML messages quote what they found; only a short token survives (a tab, a colon)
_QUOTED = re.compile(r"'([^']{5,})'|\"([^\"]{5,})\"")


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(e, "problem", None) or e.__class__.__name__
    if "maximum nesting depth" in str(problem):
        # PyYAML ≥ 6.0.3's own guard (1 000 levels, in its scanner) can fire before ours
        return where + f"nested more than {limits().max_depth} levels deep; expected a flatter one"
    return where + "YAML syntax error: " + _QUOTED.sub("'…'", str(problem))


_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Y = "tag:yaml.org,2002:"
_TEXT_TAGS = {_Y + "str", _Y + "timestamp", _Y + "value"}  # timestamps stay text (JSON-like)
_SCALAR_TAGS = {_Y + "int", _Y + "float", _Y + "bool", _Y + "null"}
_COLLECTION_TAGS = {_Y + "seq", _Y + "map"}
_INT, _FLOAT = _Y + "int", _Y + "float"
_PLAIN_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]{0,17})\Z")
_PLAIN_FLOAT = re.compile(r"[-+]?[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?\Z")


class _Loader(_Base):  # type: ignore[misc]
    """libyaml's scanner and parser with PyYAML's safe scalar rules; no composer (see
    :func:`_build`)."""


class _Open:
    """A collection being built: the object, its key awaiting a value, merges (``<<``), the
    values below it so far (aliases expanded), and its anchor."""

    __slots__ = ("obj", "key", "merges", "size", "anchor")

    def __init__(self, obj: Any, anchor: str | None) -> None:
        self.obj = obj
        self.key: Any = _NOKEY
        self.merges: list[Any] = []
        self.size = 1
        self.anchor = anchor


_NOKEY = object()
_MERGE = object()


def _build(loader: Any, path: str, doc_index: int) -> Any:
    """One document as JSON-like data (string keys, timestamps as text), straight from the
    parser's events, without recursion.

    libyaml's composer recurses in C: a few hundred kilobytes of ``[[[[`` or ``- - -``
    overflow the C stack and kill the process before any Python check can run; PyYAML's
    constructor recurses in Python. Here depth, aliases and what the aliases stand for are
    checked as the events arrive, so an alias bomb or a deep document is refused before it is
    built. Aliases share the anchored object, as PyYAML's do.
    """
    lim = limits()
    where = f"{path} (document {doc_index + 1})" if doc_index else path

    def refuse(problem: str) -> InputError:
        return InputError(f"{where}: {problem}", file=path)

    def bad(problem: str, mark: Any) -> yaml.MarkedYAMLError:
        return yaml.constructor.ConstructorError(None, None, problem, mark)

    anchors: dict[str, tuple[Any, int]] = {}  # anchor → (object, values below it)
    stack: list[_Open] = []
    tags: dict[tuple[str, Any], str] = {}  # resolved implicit tags of repeated scalars (keys)
    aliases = expanded = 0
    get_event, resolve = loader.get_event, loader.resolve
    Scalar, SeqStart, MapStart = yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent
    SeqEnd, MapEnd, Alias = yaml.SequenceEndEvent, yaml.MappingEndEvent, yaml.AliasEvent
    ScalarNode = yaml.ScalarNode
    while True:
        ev = get_event()
        t = type(ev)
        if t is Scalar:
            tag = ev.tag
            value: Any = ev.value
            if tag is None or tag == "!":
                k = (value, ev.implicit)
                tag = tags.get(k)
                if tag is None:
                    tag = resolve(ScalarNode, value, ev.implicit)
                    if len(tags) < 4096:
                        tags[k] = tag
            if tag in _TEXT_TAGS:
                pass
            elif tag == _INT and _PLAIN_INT.match(value):
                value = int(value)  # the common case, without the constructor's machinery
            elif tag == _FLOAT and _PLAIN_FLOAT.match(value):
                value = float(value)
            elif tag in _SCALAR_TAGS:
                value = loader.construct_object(ScalarNode(tag, value, ev.start_mark))
            elif tag == _Y + "merge":
                value = _MERGE
            else:
                raise bad(f"tag {tag.rsplit(':', 1)[-1]} is not allowed here", ev.start_mark)
            size = 1
            if ev.anchor is not None:
                anchors[ev.anchor] = (value, 1)
        elif t is SeqStart or t is MapStart:
            if ev.tag not in (None, "!") and ev.tag not in _COLLECTION_TAGS:
                raise bad(f"tag {ev.tag.rsplit(':', 1)[-1]} is not allowed here", ev.start_mark)
            if len(stack) >= lim.max_depth:
                raise refuse(
                    f"nested more than {lim.max_depth} levels deep; expected a flatter one"
                )
            o = _Open([] if t is SeqStart else {}, ev.anchor)
            if ev.anchor is not None:
                anchors[ev.anchor] = (o.obj, -1)  # -1: still open
            stack.append(o)
            continue
        elif t is SeqEnd or t is MapEnd:
            o = stack.pop()
            value, size = o.obj, o.size
            if o.merges:  # explicit keys win; of merged maps, the first wins
                merged: dict[str, Any] = {}
                for m in reversed(o.merges):
                    merged.update(m)
                merged.update(value)
                value.clear()
                value.update(merged)
            if o.anchor is not None:
                anchors[o.anchor] = (value, size)
        elif t is Alias:
            if ev.anchor not in anchors:
                raise bad("found an undefined alias", ev.start_mark)
            value, size = anchors[ev.anchor]
            if size < 0:
                raise refuse("an alias refers to a node that contains it; expected plain data")
            aliases += 1
            expanded += size
            if aliases > lim.yaml_aliases or expanded > lim.alias_values:
                raise refuse(
                    f"YAML aliases (*name) beyond the budget ({aliases} aliases standing for "
                    f"{expanded} values; at most {lim.yaml_aliases} and {lim.alias_values}); "
                    "expected plain data (an alias bomb?)"
                )
        else:
            raise bad(f"unexpected {t.__name__}", ev.start_mark)
        if not stack:
            if value is _MERGE:
                raise bad("a merge key (<<) outside a mapping", ev.start_mark)
            return value
        top = stack[-1]
        top.size += size
        if type(top.obj) is list:
            if value is _MERGE:
                raise bad("a merge key (<<) outside a mapping", ev.start_mark)
            top.obj.append(value)
        elif top.key is _NOKEY:
            if isinstance(value, (list, dict)):
                raise bad("a list or mapping used as a key", ev.start_mark)
            if value is not _MERGE:
                value = _key_text(value)
            top.key = value
        elif top.key is _MERGE:
            maps = value if isinstance(value, list) else [value]
            if not all(isinstance(m, dict) for m in maps):
                raise bad("a merge key (<<) needs a mapping or a list of mappings", ev.start_mark)
            top.merges.extend(maps)
            top.key = _NOKEY
        else:
            if value is _MERGE:
                raise bad("a merge key (<<) used as a value", ev.start_mark)
            top.obj[top.key] = value
            top.key = _NOKEY


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else str(key)


def parse_yaml_all(text: str, path: str) -> list[Any]:
    """Every document of a YAML stream, as JSON-like data, within the alias/size/depth limits."""
    loader = _Loader(text)
    docs: list[Any] = []
    try:
        loader.get_event()  # stream start
        while not loader.check_event(yaml.StreamEndEvent):
            loader.get_event()  # document start
            doc = _build(loader, path, len(docs))
            loader.get_event()  # document end
            docs.append(doc)
    except InputError:
        raise
    except yaml.YAMLError as e:
        where = f"{path} (document {len(docs) + 1})" if docs else path
        raise InputError(f"{where}: {_yaml_problem(e)}", file=path) from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply; expected a flatter document") from None
    except (ValueError, OverflowError) as e:  # integers beyond Python's digit limit
        raise InputError(f"{path}: {_value_problem(e)}", file=path) from None
    finally:
        loader.dispose()
    return docs


def parse_yaml(text: str, path: str) -> Any:
    """One YAML document (an empty stream is None)."""
    docs = parse_yaml_all(text, path)
    if len(docs) > 1:
        raise InputError(
            f"{path}: {len(docs)} YAML documents; expected one (no '---' separators)", file=path
        )
    return docs[0] if docs else None


def load_document(path: PathIn, what: str = "the file", nonfinite: bool = False) -> Any:
    """A JSON (by the ``.json`` suffix) or YAML file read safely; refuses an empty file.
    ``nonfinite``: JSON's NaN/Infinity pass as floats, for a schema to name (YAML's
    ``.nan``/``.inf`` always do)."""
    p = os.fspath(path)
    text = read_text(p, what)
    if not text.strip():
        raise InputError(f"{p}: the file is empty; expected {what}", file=p)
    if Path(p).suffix.lower() == ".json":
        return parse_json(text, p, nonfinite)
    return parse_yaml(text, p)


__all__ = [
    "Limits",
    "check_regular",
    "decode_text",
    "is_gzip",
    "limits",
    "load_document",
    "open_regular",
    "open_stream",
    "parse_json",
    "parse_yaml",
    "parse_yaml_all",
    "read_bytes",
    "read_text",
    "set_limits",
    "use_limits",
]
