"""Callgrind dumps, specs, the host's cache geometry and symbol maps: exact expectations on
hand-written inputs; one real callgrind run of a tiny program (no root)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from meshtax.model.microarch import CacheGeometry, CacheLevel
from meshtax.testbed.callgrind import (
    CallgrindSpec,
    DumpError,
    host_geometry,
    load_base,
    load_symbol_map,
    parse_dump,
    parse_geometry,
    parse_symbol_map,
)

DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
part: 1

desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 49152 B, 64 B, 12-way associative
desc: LL cache: 268435456 B, 64 B, direct-mapped

positions: line
events: Ir Dr I1mr Bc Bcm

ob=(1) /opt/envoy
fl=(1) ???
fn=(1) 0x0000000000401000
0 100 10 2 5 1
+2 50
cob=(2) /lib/libc.so.6
cfn=(2) memcpy
calls=3 0
0 999 999 999 999 999
fn=(3) Envoy::Http::Http1::ConnectionImpl::dispatch
0 30 0 1
ob=(2)
fn=(2)
0 7 7 0 1 1
fn=(1)
* 1
totals: 188 17 3 6 2
"""


def test_parse_dump_totals_geometry_and_self_costs() -> None:
    d = parse_dump(DUMP, functions=True)
    assert d.events == ("Ir", "Dr", "I1mr", "Bc", "Bcm")
    assert d.totals == {"Ir": 188, "Dr": 17, "I1mr": 3, "Bc": 6, "Bcm": 2}
    assert d.geometry == CacheGeometry(
        CacheLevel(32768, 8, 64),
        CacheLevel(49152, 12, 64),
        CacheLevel(268435456, 1, 64),
        "as valgrind reports them in its dump",
    )
    # the inclusive cost after calls= is not the caller's own; names are decompressed
    # (fn=(1) under ob=(2) is the same name id: callgrind shares one table for fn and cfn)
    assert d.functions == {
        ("/opt/envoy", "0x0000000000401000"): {"Ir": 150, "Dr": 10, "I1mr": 2, "Bc": 5, "Bcm": 1},
        ("/opt/envoy", "Envoy::Http::Http1::ConnectionImpl::dispatch"): {
            "Ir": 30,
            "Dr": 0,
            "I1mr": 1,
            "Bc": 0,
            "Bcm": 0,
        },
        ("/lib/libc.so.6", "memcpy"): {"Ir": 7, "Dr": 7, "I1mr": 0, "Bc": 1, "Bcm": 1},
        ("/lib/libc.so.6", "0x0000000000401000"): {"Ir": 1, "Dr": 0, "I1mr": 0, "Bc": 0, "Bcm": 0},
    }
    # self costs add up to the totals
    assert sum(c["Ir"] for c in d.functions.values()) == d.totals["Ir"]
    assert parse_dump(DUMP).functions == {}


def test_parse_dump_falls_back_to_summary_and_refuses_garbage() -> None:
    d = parse_dump("events: Ir Bc\nsummary: 5 2\n")
    assert d.totals == {"Ir": 5, "Bc": 2} and d.geometry is None
    with pytest.raises(DumpError):
        parse_dump("positions: line\n")


def test_parse_geometry_fully_associative_and_incomplete() -> None:
    lines = [
        "desc: I1 cache: 1024 B, 64 B, fully associative",
        "desc: D1 cache: 1024 B, 64 B, 2-way associative",
    ]
    assert parse_geometry(lines) is None
    g = parse_geometry([*lines, "desc: LL cache: 8192 B, 64 B, 4-way associative"])
    assert g is not None and g.i1 == CacheLevel(1024, 16, 64) and g.ll.sets == 32


def test_spec_args() -> None:
    out = Path("/w/cg.out")
    assert CallgrindSpec().args(out) == [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/w/cg.out",
        "--dump-instr=no",
        "--collect-jumps=no",
    ]
    g = CacheGeometry(
        CacheLevel(32768, 8, 64), CacheLevel(32768, 8, 64), CacheLevel(1 << 25, 16, 64)
    )
    args = CallgrindSpec(True, True, g, separate_threads=True).args(out)
    assert args[5:] == [
        "--cache-sim=yes",
        "--I1=32768,8,64",
        "--D1=32768,8,64",
        "--LL=33554432,16,64",
        "--branch-sim=yes",
        "--separate-threads=yes",
    ]


def _cache_dir(root: Path, i: int, level: int, kind: str, size: str, ways: int) -> None:
    d = root / f"index{i}"
    d.mkdir(parents=True)
    for name, v in (
        ("level", level),
        ("type", kind),
        ("size", size),
        ("ways_of_associativity", ways),
        ("coherency_line_size", 64),
    ):
        (d / name).write_text(f"{v}\n")


def test_host_geometry_from_sys(tmp_path: Path) -> None:
    _cache_dir(tmp_path, 0, 1, "Data", "32K", 8)
    _cache_dir(tmp_path, 1, 1, "Instruction", "32K", 8)
    _cache_dir(tmp_path, 2, 2, "Unified", "512K", 8)
    _cache_dir(tmp_path, 3, 3, "Unified", "32768K", 16)
    g = host_geometry(tmp_path)
    assert g is not None
    assert (g.i1, g.d1, g.ll) == (
        CacheLevel(32768, 8, 64),
        CacheLevel(32768, 8, 64),
        CacheLevel(32 << 20, 16, 64),
    )
    assert "this host" in g.origin


def test_host_geometry_refuses_what_valgrind_cannot_simulate(tmp_path: Path) -> None:
    _cache_dir(tmp_path, 0, 1, "Data", "48K", 12)
    _cache_dir(tmp_path, 1, 1, "Instruction", "32K", 8)
    _cache_dir(tmp_path, 2, 3, "Unified", "30M", 12)  # 40 960 sets: not a power of two
    assert host_geometry(tmp_path) is None
    assert host_geometry(tmp_path / "missing") is None


def test_load_base_and_symbol_map(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "maps").write_text(
        "5555000000-5555100000 r--p 00000000 08:01 7 /opt/envoy\n"
        "5555100000-5556000000 r-xp 00100000 08:01 7 /opt/envoy\n"
        "7f00000000-7f00001000 r--p 00000000 08:01 9 /lib/libc.so.6\n"
    )
    assert load_base(42, "/opt/envoy", tmp_path) == 0x5555000000
    assert load_base(42, "/opt/other", tmp_path) is None
    assert load_base(43, "/opt/envoy", tmp_path) is None
    text = (
        "0000000000101000 T Envoy::Http::Http1::ConnectionImpl::dispatch(Buffer&)\n"
        "0000000000100000 t main\n"
        "0000000000200000 D some_data\n"
        "                 U memcpy\n"
    )
    m = parse_symbol_map(text)
    assert m.starts == (0x100000, 0x101000)
    assert m.name(0x100010) == "main"
    assert m.name(0x101500) == "Envoy::Http::Http1::ConnectionImpl::dispatch(Buffer&)"
    assert m.name(0x10) is None
    (tmp_path / "bad.map").write_text("0000 D data\n")
    with pytest.raises(ValueError, match=r"bad\.map: no code symbols"):
        load_symbol_map(tmp_path / "bad.map")
    with pytest.raises(ValueError, match="nope.map"):
        load_symbol_map(tmp_path / "nope.map")


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind missing")
def test_real_callgrind_dump_parses(tmp_path: Path) -> None:
    """A real dump of /bin/true with both simulators and threads apart: the parser reads
    every event, the geometry valgrind was given, and self costs that sum to the totals."""
    g = CacheGeometry(
        CacheLevel(32768, 8, 64), CacheLevel(32768, 8, 64), CacheLevel(1 << 22, 16, 64)
    )
    argv = CallgrindSpec(True, True, g, separate_threads=True).args(tmp_path / "cg.out")
    subprocess.run([*argv, "/bin/true"], check=True, capture_output=True, timeout=120)
    d = parse_dump((tmp_path / "cg.out-01").read_text(), functions=True)
    assert d.events == tuple("Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim".split())
    assert d.geometry is not None and (d.geometry.i1, d.geometry.d1, d.geometry.ll) == (
        g.i1,
        g.d1,
        g.ll,
    )
    assert d.totals["Ir"] > 10_000 and 0 < d.totals["I1mr"] < d.totals["Ir"]
    assert sum(c["Ir"] for c in d.functions.values()) == d.totals["Ir"]
