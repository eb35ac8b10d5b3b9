"""Trace inputs: a directory is walked in the order of its sorted paths (as a sorted
``os.walk`` listing, without a stat per file), a file is one document or JSON Lines."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from meshtax.traces import inputs
from meshtax.traces.errors import TraceFormatError

NAMES = ["a", "a.json", "a0", "a-b", "A", "b", ".hidden", "a b", "é", "z9", "a.", "_x", "a~"]


def _os_walk(top: str) -> list[str]:
    """What the walk must give: os.walk's regular files (hidden ones and hidden directories
    skipped), sorted."""
    found = []
    for d, dirs, files in os.walk(top):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        found += [
            os.path.join(d, f)
            for f in files
            if not f.startswith(".") and os.path.isfile(os.path.join(d, f))
        ]
    return sorted(found)


def _fill(rng: random.Random, root: Path, d: Path, depth: int) -> None:
    for name in rng.sample(NAMES, rng.randint(0, len(NAMES))):
        p = d / name
        r = rng.random()
        if depth < 3 and r < 0.3:
            p.mkdir()
            _fill(rng, root, p, depth + 1)
        elif r < 0.38:
            p.symlink_to(root)  # a link to a directory: not followed
        elif r < 0.45:
            p.symlink_to(d / "nowhere")  # broken
        elif r < 0.5:
            os.mkfifo(p)  # not a regular file
        elif r < 0.55 and any(x.is_file() for x in d.iterdir()):
            p.symlink_to(next(x for x in sorted(d.iterdir()) if x.is_file()))  # followed
        else:
            p.write_text("{}")


@pytest.mark.parametrize("seed", range(15))
def test_walk_is_sorted_os_walk(tmp_path: Path, seed: int) -> None:
    _fill(random.Random(seed), tmp_path, tmp_path, 0)
    for top in (str(tmp_path), str(tmp_path) + "/"):
        assert list(inputs._walk(top)) == _os_walk(top)
    # "a/…" sorts before "a0" and after "a.json": a directory sorts as its name and "/"
    (tmp_path / "x").mkdir()
    for name in ("a", "a0", "a.json"):
        (tmp_path / "x" / name).mkdir() if name == "a" else (tmp_path / "x" / name).write_text("")
    (tmp_path / "x" / "a" / "f").write_text("")
    got = [
        Path(p).relative_to(tmp_path / "x").as_posix() for p in inputs._walk(str(tmp_path / "x"))
    ]
    assert got == ["a.json", "a/f", "a0"]


def test_sources_stream_and_empty_directory_is_refused(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"{i}.json").write_text("{}")
    it = inputs.iter_sources([str(tmp_path), "-"])
    assert next(it).name == str(tmp_path / "0.json")  # before the rest is looked at
    assert [s.name for s in it] == [str(tmp_path / f"{i}.json") for i in (1, 2)] + ["-"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceFormatError, match="holds no files"):
        list(inputs.iter_sources(tmp_path / "empty"))


@pytest.mark.parametrize(
    ("data", "docs"),
    [
        (b'{"a": 1}', [(0, b'{"a": 1}')]),
        (b'\n\n  {"a": 1}\n\n', [(0, b'\n\n  {"a": 1}\n\n')]),  # one line and blank ones
        (b'{"a": 1}\n{"b": 2}\n', [(1, b'{"a": 1}'), (2, b'{"b": 2}')]),  # JSON Lines
        (b'\n{"a": 1}\n\n{"b": 2}', [(2, b'{"a": 1}'), (4, b'{"b": 2}')]),
        (b'{\n  "a": 1\n}\n', [(0, b'{\n  "a": 1\n}\n')]),  # one document on many lines
        (b'[{"a": 1},\n {"b": 2}]', [(0, b'[{"a": 1},\n {"b": 2}]')]),
    ],
)
def test_documents_of_a_file(tmp_path: Path, data: bytes, docs: list[tuple[int, bytes]]) -> None:
    p = tmp_path / "f.json"
    p.write_bytes(data)
    assert list(inputs.documents(inputs.Source(str(p)))) == docs


@pytest.mark.parametrize("data", [b"", b"  \n\t\n"])
def test_blank_file_is_refused(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "f.json"
    p.write_bytes(data)
    with pytest.raises(TraceFormatError, match="empty file"):
        list(inputs.documents(inputs.Source(str(p))))


def test_plain_read_leaves_compressed_and_large_files_to_the_long_way(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b'{"a": 1}')
    assert inputs.read_plain(inputs.Source(str(p)), 100) == b'{"a": 1}'
    assert inputs.read_plain(inputs.Source(str(p)), 3) is None  # beyond the limit
    p.write_bytes(inputs.GZIP_MAGIC + b"rest")
    assert inputs.read_plain(inputs.Source(str(p)), 100) is None
    with pytest.raises(TraceFormatError, match="cannot read"):
        inputs.read_plain(inputs.Source(str(tmp_path / "absent")), 100)


def test_read_range(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"0123456789")
    assert inputs.read_range(str(p), 2, 7) == b"23456"
    with pytest.raises(TraceFormatError, match="shorter than when it was cut"):
        inputs.read_range(str(p), 8, 12)
