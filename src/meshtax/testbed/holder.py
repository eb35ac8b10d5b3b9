"""The connection holder: a child process (``python -m meshtax.testbed.holder SPEC.json``)
that opens ``n`` connections through a sidecar, completes one exchange on each (a request in
HTTP and gRPC mode, an echoed line in TCP mode) so every connection is fully set up, then
keeps them open and idle until SIGTERM. It writes a status JSON when done opening.

The parent's side: :class:`HolderSpec` (what to hold), :func:`holder_argv`, :func:`wait_status`.
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import ssl
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.testbed.h2client import HEALTH_PATH, grpc_message, unary_call_async
from meshtax.testbed.system import Process, wait_until

__all__ = ["HolderError", "HolderSpec", "HolderTls", "holder_argv", "raise_nofile", "wait_status"]


class HolderError(RuntimeError):
    """The holder could not open or hold its connections."""


@dataclass(frozen=True)
class HolderTls:
    """Client-side TLS for a holder that stands in for calling sidecars (PEM file paths)."""

    cert: str
    key: str
    ca: str
    version: str = "1.3"


@dataclass(frozen=True)
class HolderSpec:
    """``n`` connections to ``host:port`` in ``mode``, ``parallel`` opened at once; status
    written to ``status``."""

    host: str
    port: int
    mode: str
    n: int
    status: str
    parallel: int = 32
    tls: HolderTls | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> HolderSpec:
        d: dict[str, Any] = json.loads(text)
        tls = d.pop("tls", None)
        return cls(**d, tls=HolderTls(**tls) if tls else None)


def holder_argv(spec_file: Path) -> list[str]:
    """Argv of the holder (this module, run by the current interpreter)."""
    return [sys.executable, "-m", "meshtax.testbed.holder", str(spec_file)]


def wait_status(path: Path, proc: Process, timeout: float) -> dict[str, Any]:
    """The holder's status once it has written it; raises if it exits first or times out."""
    if not wait_until(lambda: path.exists() or proc.poll() is not None, timeout):
        raise HolderError(f"connection holder not done after {timeout:.0f}s")
    if not path.exists():
        raise HolderError(f"connection holder exited {proc.poll()} before holding its connections")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def raise_nofile(needed: int) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit (and, as root, the hard one) to at least
    ``needed``; children inherit it. Returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    if hard < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return needed
        except (ValueError, OSError) as e:
            raise HolderError(
                f"RLIMIT_NOFILE hard limit {hard} < {needed}; raise it (ulimit -Hn) or run as root"
            ) from e
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed


# ---- the child -----------------------------------------------------------------------------


def _client_ssl(tls: HolderTls, mode: Mode) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # peers are named by URI SANs, checked by the sidecar's CA
    ctx.load_verify_locations(cafile=tls.ca)
    ctx.load_cert_chain(tls.cert, tls.key)
    v = ssl.TLSVersion.TLSv1_3 if tls.version == "1.3" else ssl.TLSVersion.TLSv1_2
    ctx.minimum_version = ctx.maximum_version = v
    alpn = {Mode.GRPC: ["h2"], Mode.HTTP: ["http/1.1"], Mode.TCP: []}[mode]
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


async def _exchange(mode: Mode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    if mode is Mode.TCP:
        writer.write(b"meshtax\n")
        await writer.drain()
        if await reader.readexactly(8) != b"meshtax\n":
            raise HolderError("tcp echo mismatch")
        return
    if mode is Mode.HTTP:
        writer.write(b"GET /echo HTTP/1.1\r\nHost: app\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status + b" ":
            raise HolderError(f"http status {status!r}")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
        return
    # one unary gRPC health check: a real stream through both sidecars, connection kept
    await unary_call_async(reader, writer, HEALTH_PATH, grpc_message(b""))


async def _hold(spec: HolderSpec) -> None:
    mode = Mode(spec.mode)
    ctx = _client_ssl(spec.tls, mode) if spec.tls else None
    gate = asyncio.Semaphore(spec.parallel)
    held: list[asyncio.StreamWriter] = []
    errors: list[str] = []

    async def one() -> None:
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(spec.host, spec.port, ssl=ctx), 10
                )
                await asyncio.wait_for(_exchange(mode, reader, writer), 10)
                held.append(writer)
            except (
                TimeoutError,
                OSError,
                asyncio.IncompleteReadError,
                HolderError,
                ValueError,
            ) as e:
                errors.append(f"{type(e).__name__}: {e}")

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(spec.n)))
    doc = {"open": len(held), "failed": len(errors), "errors": errors[:5]}
    doc["seconds"] = time.monotonic() - t0
    status = Path(spec.status)
    tmp = status.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(status)  # atomic: the parent never reads half a file
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for w in held:
        w.close()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m meshtax.testbed.holder SPEC.json", file=sys.stderr)
        return 2
    spec = HolderSpec.from_json(Path(argv[0]).read_text())
    raise_nofile(spec.n + 64)
    asyncio.run(_hold(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
