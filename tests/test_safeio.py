"""meshtax.safeio: regular files only, limits, JSON/YAML without surprises."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from meshtax import safeio
from meshtax.errors import InputError


def test_only_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="FIFO"):
        safeio.read_text(fifo)  # would block forever if opened
    with pytest.raises(InputError, match="character device"):
        safeio.read_bytes("/dev/zero")
    with pytest.raises(InputError, match="a directory"):
        safeio.read_text(tmp_path)
    with pytest.raises(InputError, match="file not found"):
        safeio.read_text(tmp_path / "missing")
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="character device"):
        safeio.read_text(link)


def test_size_limit_and_raising_it(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("a: 1\n" * 1000)
    with safeio.use_limits(max_bytes=100), pytest.raises(InputError, match="limit"):
        safeio.read_text(p)
    assert safeio.read_text(p).count("a: 1") == 1000
    with pytest.raises(InputError, match="not UTF-8"):
        p.write_bytes(b"a: \xff\xfe")
        safeio.read_text(p)


def test_decompression_limit_and_corrupt_gzip(tmp_path: Path) -> None:
    p = tmp_path / "x.gz"
    p.write_bytes(gzip.compress(b"0" * (8 << 20), 9))  # 8 MiB from ~8 KiB
    with safeio.use_limits(min_decompressed=1 << 20), pytest.raises(InputError, match="bomb"):
        with safeio.open_stream(p) as f:
            while f.read(1 << 16):
                pass
    with safeio.open_stream(p) as f:  # within the default limit
        assert len(f.read()) == 8 << 20
    data = gzip.compress(os.urandom(100_000))
    p.write_bytes(data[:-5000])
    with pytest.raises(InputError, match="corrupt or truncated gzip"):
        with safeio.open_stream(p) as f:
            f.read()


def test_json_refuses_nan_unless_asked_and_deep_nesting() -> None:
    with pytest.raises(InputError, match="NaN"):
        safeio.parse_json('{"a": NaN}', "x.json")
    assert safeio.parse_json('{"a": Infinity}', "x.json", nonfinite=True)["a"] == float("inf")
    with pytest.raises(InputError, match="nested"):
        safeio.parse_json("[" * 300 + "]" * 300, "x.json")
    with pytest.raises(InputError, match="integer with thousands of digits"):
        safeio.parse_json("1" * 5000, "x.json")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [1, *a]\n", "refers to a node that contains it"),
        ("[" * 100_000 + "]" * 100_000, "nested more than"),
        ("- " * 100_000 + "x", "nested more than"),
        ("a: !!python/object/apply:os.system [echo]\n", "not allowed"),
        ("a: !!binary aGk=\n", "not allowed"),
        ("x: *nope\n", "undefined alias"),
        ("a: [1, 2\n", "YAML syntax error"),
    ],
)
def test_yaml_refusals(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        safeio.parse_yaml(text, "x.yaml")


def test_yaml_alias_budget() -> None:
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    with pytest.raises(InputError, match="aliases"):
        safeio.parse_yaml(bomb, "x.yaml")
    ok = "d: &d {k: 1}\ne: *d\nf: {<<: *d, g: 2}\n"
    assert safeio.parse_yaml(ok, "x.yaml") == {"d": {"k": 1}, "e": {"k": 1}, "f": {"k": 1, "g": 2}}


def test_yaml_is_json_like() -> None:
    doc = safeio.parse_yaml("2026-11-22: x\n1: y\ntrue: z\n~: w\nt: 2026-11-22\n", "x.yaml")
    assert doc == {"2026-11-22": "x", "1": "y", "true": "z", "null": "w", "t": "2026-11-22"}
    with pytest.raises(InputError, match="2 YAML documents"):
        safeio.parse_yaml("a: 1\n---\nb: 2\n", "x.yaml")
    assert safeio.parse_yaml_all("a: 1\n---\nb: 2\n", "x.yaml") == [{"a": 1}, {"b": 2}]


def test_syntax_errors_do_not_quote_the_file() -> None:
    with pytest.raises(InputError) as e:
        safeio.parse_yaml("%SECRETDIRECTIVE x\n---\na", "x.yaml")
    assert "SECRET" not in str(e.value)
