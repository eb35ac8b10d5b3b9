"""The no-op proxy-wasm filter module: ``noop.wat`` assembled with ``wat2wasm`` (Debian ``wabt``).

The binary is never committed: it is built on first use into a cache directory, named by the
hash of the WAT source so an edited source rebuilds, and written atomically so concurrent
builders never see half a file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from meshtax.testbed.system import RealSystem, System

__all__ = [
    "ABI_EXPORT",
    "WAT_PATH",
    "WasmBuildError",
    "build_noop",
    "cache_dir",
    "noop_module",
    "wasm_exports",
]

WAT_PATH = Path(__file__).with_name("noop.wat")
ABI_EXPORT = "proxy_abi_version_0_2_0"


class WasmBuildError(RuntimeError):
    """``wat2wasm`` is missing or refused the source."""


def cache_dir() -> Path:
    """``$MESHTAX_CACHE_DIR/wasm`` if set, else the user cache dir (platformdirs)."""
    env = os.environ.get("MESHTAX_CACHE_DIR")
    if env:
        return Path(env) / "wasm"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("meshtax")) / "wasm"


def build_noop(
    system: System | None = None, cache: Path | None = None, wat: Path = WAT_PATH
) -> Path:
    """Path of the assembled module, building it if the cache has no copy for this source."""
    source = wat.read_bytes()
    out_dir = cache or cache_dir()
    out = out_dir / f"{wat.stem}-{hashlib.sha256(source).hexdigest()[:16]}.wasm"
    if out.is_file():
        return out
    tool = shutil.which("wat2wasm")
    if tool is None:
        raise WasmBuildError("wat2wasm not found: install Debian's 'wabt' (requirements/apt.txt)")
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".wasm.tmp")
    os.close(fd)
    try:
        done = (system or RealSystem()).run([tool, str(wat), "-o", tmp], check=False)
        if done.returncode != 0:
            raise WasmBuildError(f"wat2wasm {wat}: {done.stderr.strip() or done.stdout.strip()}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def noop_module(system: System | None = None, cache: Path | None = None) -> bytes:
    """The bytes of the no-op module (built on first use)."""
    return build_noop(system, cache).read_bytes()


def _leb_u32(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def wasm_exports(data: bytes) -> dict[str, int]:
    """Export names of a wasm binary → their kind (0 function, 1 table, 2 memory, 3 global).

    Enough of the binary format to check a module before handing it to Envoy.
    """
    if data[:8] != b"\0asm\x01\0\0\0":
        raise ValueError("not a wasm v1 binary")
    i, out = 8, {}
    while i < len(data):
        section = data[i]
        size, i = _leb_u32(data, i + 1)
        end = i + size
        if section == 7:  # export section
            count, j = _leb_u32(data, i)
            for _ in range(count):
                n, j = _leb_u32(data, j)
                name = data[j : j + n].decode()
                kind = data[j + n]
                _, j = _leb_u32(data, j + n + 1)
                out[name] = kind
        i = end
    return out
