"""Callgrind as a counter: how a process runs under it (instructions only, or with valgrind's
cache and branch simulators), what one dump says (every event, the simulated cache geometry,
the self cost of every function), and the host's own cache geometry to simulate.

Pure except :func:`host_geometry` and :func:`load_base`, which read a ``/sys`` or ``/proc``
root given to them (tests point them at fake trees).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from meshtax.model.microarch import CacheGeometry, CacheLevel

__all__ = [
    "CACHE_SYS",
    "CallgrindDump",
    "CallgrindSpec",
    "DumpError",
    "SymbolMap",
    "host_geometry",
    "load_base",
    "load_symbol_map",
    "parse_dump",
    "parse_geometry",
    "parse_symbol_map",
]

CACHE_SYS = Path("/sys/devices/system/cpu/cpu0/cache")


class DumpError(ValueError):
    """A callgrind dump without events or totals."""


@dataclass(frozen=True)
class CallgrindSpec:
    """How to run a process under callgrind. The default counts instructions only (the
    cheapest callgrind); ``cache_sim``/``branch_sim`` add the I1/D1/LL and branch
    simulators, ``geometry`` sets the simulated caches (None: valgrind's detection);
    ``separate_threads`` dumps each thread apart (the simulated caches stay shared)."""

    cache_sim: bool = False
    branch_sim: bool = False
    geometry: CacheGeometry | None = None
    separate_threads: bool = False

    def args(self, out_file: Path) -> list[str]:
        argv = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_file}",
            "--dump-instr=no",
            "--collect-jumps=no",
        ]
        if self.cache_sim:
            argv.append("--cache-sim=yes")
            if self.geometry is not None:
                g = self.geometry
                argv += [f"--I1={g.i1.arg()}", f"--D1={g.d1.arg()}", f"--LL={g.ll.arg()}"]
        if self.branch_sim:
            argv.append("--branch-sim=yes")
        if self.separate_threads:
            argv.append("--separate-threads=yes")
        return argv


@dataclass(frozen=True)
class CallgrindDump:
    """One dump: its events (in the dump's order), totals per event, the simulated cache
    geometry (None without ``--cache-sim``) and, when asked for, the self cost of every
    function per event, keyed by (object file, function name)."""

    events: tuple[str, ...]
    totals: Mapping[str, int]
    geometry: CacheGeometry | None = None
    functions: Mapping[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)


_LEVEL = re.compile(
    r"desc:\s*(I1|D1|LL) cache:\s*(\d+) B,\s*(\d+) B,\s*(direct-mapped|fully associative|(\d+)-way)"
)


def parse_geometry(lines: Iterable[str]) -> CacheGeometry | None:
    """The ``desc: I1 cache: 32768 B, 64 B, 8-way associative`` lines of a dump header."""
    got: dict[str, CacheLevel] = {}
    for line in lines:
        m = _LEVEL.match(line)
        if not m:
            continue
        size, line_b = int(m.group(2)), int(m.group(3))
        assoc = (
            1
            if m.group(4) == "direct-mapped"
            else size // line_b
            if m.group(4) == "fully associative"
            else int(m.group(5))
        )
        got[m.group(1)] = CacheLevel(size, assoc, line_b)
    if set(got) != {"I1", "D1", "LL"}:
        return None
    return CacheGeometry(got["I1"], got["D1"], got["LL"], "as valgrind reports them in its dump")


def _name(table: dict[str, str], text: str) -> str:
    """Callgrind's name compression: ``(12) name`` defines id 12, ``(12)`` refers to it."""
    text = text.strip()
    if text.startswith("("):
        ident, _, rest = text[1:].partition(")")
        rest = rest.strip()
        if rest:
            table[ident] = rest
            return rest
        return table.get(ident, f"({ident})")
    return text


def _costs(tokens: list[str], n: int) -> list[int]:
    vals = [int(t, 16) if t.startswith("0x") else int(t) for t in tokens[:n]]
    return vals + [0] * (n - len(vals))


def parse_dump(text: str, *, functions: bool = False) -> CallgrindDump:
    """Events, totals (``totals:`` line, else ``summary:``), geometry and, with ``functions``,
    self cost per (object, function): cost lines directly under ``fn=``, not the inclusive
    cost line after ``calls=``."""
    lines = text.splitlines()
    events: tuple[str, ...] = ()
    totals: dict[str, int] | None = None
    summary: dict[str, int] | None = None
    obs: dict[str, str] = {}
    fns: dict[str, str] = {}
    by_fn: dict[tuple[str, str], list[int]] = {}
    ob = fn = ""
    after_calls = False
    for line in lines:
        if not line:
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            if after_calls:  # inclusive cost of the call just named: not this function's own
                after_calls = False
                continue
            if functions and events:
                acc = by_fn.setdefault((ob, fn), [0] * len(events))
                for i, v in enumerate(_costs(line.split()[1:], len(events))):
                    acc[i] += v
            continue
        key, _, rest = line.partition("=")
        if key == "fn" or key == "cfn":
            name = _name(fns, rest)
            if key == "fn":
                fn = name
        elif key == "ob" or key == "cob":
            name = _name(obs, rest)
            if key == "ob":
                ob = name
        elif key == "calls":
            after_calls = True
        elif line.startswith("events:"):
            events = tuple(line[len("events:") :].split())
        elif line.startswith("totals:") and events:
            totals = dict(zip(events, _costs(line[len("totals:") :].split(), len(events))))
        elif line.startswith("summary:") and events:
            summary = dict(zip(events, _costs(line[len("summary:") :].split(), len(events))))
    if not events or (totals is None and summary is None):
        raise DumpError("callgrind dump has no events or totals/summary line")
    return CallgrindDump(
        events,
        totals if totals is not None else summary or {},
        parse_geometry(lines),
        {k: dict(zip(events, v)) for k, v in by_fn.items()},
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _size(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def host_geometry(root: Path = CACHE_SYS) -> CacheGeometry | None:
    """This CPU's L1i, L1d and last-level cache from ``/sys`` (``root``: cpu0's ``cache``
    directory), when valgrind can simulate them (a power-of-two number of sets); else None
    and valgrind detects the caches itself."""
    found: dict[tuple[int, str], CacheLevel] = {}
    for d in sorted(root.glob("index*")):
        vals = [_read(d / f) for f in ("level", "type", "size", "ways_of_associativity")]
        line = _read(d / "coherency_line_size")
        if any(v is None for v in vals) or line is None:
            continue
        level, kind, size, ways = (v or "" for v in vals)
        try:
            found[(int(level), kind)] = CacheLevel(_size(size), int(ways), int(line))
        except ValueError:
            continue
    i1, d1 = found.get((1, "Instruction")), found.get((1, "Data"))
    unified = sorted((lv, c) for (lv, k), c in found.items() if k == "Unified")
    if i1 is None or d1 is None or not unified:
        return None
    ll = unified[-1][1]
    if any(c.sets & (c.sets - 1) for c in (i1, d1, ll)):
        return None  # valgrind refuses a set count that is not a power of two
    return CacheGeometry(i1, d1, ll, "this host's caches (/sys)")


def load_base(pid: int, binary: str, proc: Path = Path("/proc")) -> int | None:
    """Where ``binary`` is mapped in process ``pid`` (its mapping at file offset 0), from
    ``/proc/PID/maps``; callgrind names functions of a stripped binary by run-time address."""
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].strip() == binary and int(parts[2], 16) == 0:
            return int(parts[0].split("-")[0], 16)
    return None


@dataclass(frozen=True)
class SymbolMap:
    """Function start addresses (offsets in the binary) and names, sorted by address."""

    starts: tuple[int, ...]
    names: tuple[str, ...]

    def name(self, offset: int) -> str | None:
        """The function whose start is the last at or before ``offset``."""
        i = bisect.bisect_right(self.starts, offset) - 1
        return self.names[i] if i >= 0 else None


def parse_symbol_map(text: str) -> SymbolMap:
    """``nm -C --defined-only BINARY`` output (``ADDRESS TYPE NAME``): its code symbols."""
    rows: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1] in "tTwWiI":
            try:
                rows.setdefault(int(parts[0], 16), parts[2].strip())
            except ValueError:
                continue
    if not rows:
        raise ValueError("no code symbols in the symbol map (expected `nm -C` output)")
    starts = sorted(rows)
    return SymbolMap(tuple(starts), tuple(rows[a] for a in starts))


def load_symbol_map(path: str | Path) -> SymbolMap:
    """:func:`parse_symbol_map` of a file; ``ValueError`` names the file when it is unusable."""
    try:
        return parse_symbol_map(Path(path).read_text(errors="replace"))
    except OSError as e:
        raise ValueError(f"symbol map {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"symbol map {path}: {e}") from None
