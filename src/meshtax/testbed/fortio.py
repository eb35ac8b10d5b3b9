"""The real load generator and echo servers: fortio (v1.68.x).

Echo servers: ``fortio server`` with an HTTP echo (POST bodies are echoed back), a gRPC ping
server (the ping payload is echoed back) and a TCP echo. Load: ``fortio load`` with
``-payload-size N`` in every mode, so a message of N bytes goes each way in all three modes.

Result parsing and argv building are pure; running goes through
:class:`~meshtax.testbed.system.System`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from meshtax.model.sidecar import Mode
from meshtax.testbed.lifecycle import Started
from meshtax.testbed.system import Placement, Process, RealSystem, System

__all__ = [
    "DEFAULT_RESOLUTION_S",
    "FortioError",
    "FortioServer",
    "LoadFailed",
    "LoadResult",
    "LoadSpec",
    "beyond_histogram",
    "check_result",
    "fortio_binary",
    "fortio_version",
    "histogram_quantiles",
    "load_argv",
    "measure_max_qps",
    "parse_result",
    "run_load",
    "run_spec",
    "server_argv",
]

# fortio's histogram buckets are multiples of the resolution: 1,2,…,10,12,…,20,25,…,50,60,…,
# 100,120,…,200,250,…,500,600,…,1000,2000,…  At 1 µs every bucket between 10 µs and 1 ms is
# at most 10 % wide; the default (1 ms) puts all sub-ms latencies in one bucket. Finer than
# 1 µs coarsens the 100 µs–1 ms range (buckets jump 1000→2000 units), so 1 µs is the choice.
DEFAULT_RESOLUTION_S = 1e-6
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# what fortio reports for a successful call, per run type
_OK_CODES = {Mode.HTTP: ("200",), Mode.GRPC: ("SERVING", "OK"), Mode.TCP: ("OK",)}


class FortioError(RuntimeError):
    """fortio could not be found, did not start, or printed something unparseable."""


class LoadFailed(FortioError):
    """A load run had failed calls (fortio still exits 0 then) or did no calls at all."""


def fortio_binary() -> Path:
    """fortio from the project's tool dir (``.tools/bin``, by scripts/install.sh) or PATH."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / ".tools" / "bin" / "fortio"
        if cand.is_file():
            return cand
    found = shutil.which("fortio")
    if found:
        return Path(found)
    raise FortioError("fortio not found in .tools/bin or on PATH: run scripts/install.sh")


def fortio_version(system: System | None = None, binary: Path | None = None) -> str:
    """``fortio version`` (short form, e.g. ``1.68.2``)."""
    system = system or RealSystem()
    return system.run([str(binary or fortio_binary()), "version"]).stdout.strip()


def target_url(mode: Mode | str, hostport: str) -> str:
    """The fortio target for ``host:port`` in a mode (HTTP echo path, bare gRPC, tcp://).

    A ``target`` that already has a scheme (``http://…/echo?status=503``) is used as is.
    """
    mode = Mode(mode)
    if "://" in hostport:
        return hostport
    if mode is Mode.HTTP:
        return f"http://{hostport}/echo"
    if mode is Mode.TCP:
        return f"tcp://{hostport}"
    return hostport


@dataclass(frozen=True)
class LoadSpec:
    """Everything that defines one fortio load run; echoed in its :class:`LoadResult`.

    ``qps=0`` is closed loop at max speed (with ``connections=1``: one request in flight, the
    latency setting); a positive ``qps`` is a fixed rate (the CPU setting). Give exactly one
    of ``duration_s`` and ``n``. ``offset_s``: where fortio's histogram starts (its
    ``-offset``); its finite buckets end ``100 000 × resolution_s`` above it (100 ms at 1 µs),
    and a percentile beyond that is fortio's interpolation up to the run's maximum
    (:func:`beyond_histogram`) — to see latencies around a server's fixed delay, offset by it.
    """

    target: str  # host:port of the first hop (sidecar or app)
    mode: Mode = Mode.HTTP
    size_bytes: int = 100
    qps: float = 0.0
    connections: int = 1
    duration_s: float | None = None
    n: int | None = None
    resolution_s: float = DEFAULT_RESOLUTION_S
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    timeout_s: float = 3.0
    extra_args: tuple[str, ...] = ()
    offset_s: float = 0.0
    # the largest response expected (HTTP): fortio's fast client keeps a whole response in a
    # fixed buffer (128 KiB by default) and fails every request whose response does not fit
    response_bytes: int = 0
    # a file for fortio's access log (one line per request, its latency to 1 µs): the
    # percentiles then come from every request's latency, not from the histogram, whose
    # buckets are 1 ms wide from 1 to 5 ms at 1 µs resolution (]1000, 2000] µs, …) and put a
    # percentile there by linear interpolation across the bucket ("": the histogram's)
    access_log: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if (self.duration_s is None) == (self.n is None):
            raise ValueError("give exactly one of duration_s and n")
        if self.resolution_s > DEFAULT_RESOLUTION_S:
            raise ValueError(f"histogram resolution {self.resolution_s}s is too coarse (max 1e-6)")
        if self.size_bytes < 0 or self.connections < 1 or self.qps < 0:
            raise ValueError("size_bytes >= 0, connections >= 1, qps >= 0")
        if self.offset_s < 0:
            raise ValueError("offset_s >= 0")

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                "target": self.target,
                "mode": self.mode.value,
                "size_bytes": self.size_bytes,
                "qps": self.qps,
                "connections": self.connections,
                "duration_s": self.duration_s,
                "n": self.n,
                "resolution_s": self.resolution_s,
            }
            | ({"offset_s": self.offset_s} if self.offset_s else {})
            | ({"percentiles_from": "access log"} if self.access_log else {})
        )


FAST_CLIENT_BUFFER_BYTES = 128 * 1024  # fortio's -httpbufferkb default
HEADROOM_BYTES = 16 * 1024  # the response's status line and headers


def load_argv(spec: LoadSpec, binary: Path) -> list[str]:
    """``fortio load`` argv for ``spec``; the JSON result goes to stdout (``-json -``)."""
    argv = [
        str(binary),
        "load",
        "-quiet",
        "-json",
        "-",
        "-c",
        str(spec.connections),
        "-qps",
        f"{spec.qps:g}",
        "-r",
        f"{spec.resolution_s:g}",
        "-p",
        ",".join(f"{p:g}" for p in spec.percentiles),
        "-timeout",
        f"{spec.timeout_s:g}s",
    ]
    if spec.offset_s > 0:
        argv += ["-offset", f"{spec.offset_s:g}s"]
    if spec.access_log:
        argv += ["-access-log-file", spec.access_log, "-access-log-format", "json"]
    if spec.n is not None:
        argv += ["-n", str(spec.n)]
    else:
        argv += ["-t", f"{spec.duration_s:g}s"]
    if spec.size_bytes > 0:
        # HTTP: POST of N random bytes, echoed; gRPC ping: N-byte payload, echoed; TCP: N bytes
        argv += ["-payload-size", str(spec.size_bytes)]
        if spec.size_bytes >= 256 * 1024:  # fortio refuses payloads above this cap (256 KiB)
            argv += ["-maxpayloadsizekb", str(spec.size_bytes // 1024 + 1)]
    if spec.mode is Mode.GRPC:
        argv += ["-grpc", "-ping"]
    elif spec.mode is Mode.HTTP:
        body = max(spec.size_bytes, spec.response_bytes)  # an echo answers with the payload
        if body + HEADROOM_BYTES > FAST_CLIENT_BUFFER_BYTES:
            argv += ["-httpbufferkb", str((body + HEADROOM_BYTES) // 1024 + 1)]
    argv += list(spec.extra_args)
    argv.append(target_url(spec.mode, spec.target))
    return argv


@dataclass(frozen=True)
class LoadResult:
    """The parsed outcome of one fortio run; latencies in µs."""

    spec: LoadSpec
    count: int
    errors: int
    ret_codes: Mapping[str, int]
    actual_qps: float
    duration_s: float
    min_us: float
    avg_us: float
    max_us: float
    stddev_us: float
    percentiles_us: Mapping[float, float]
    sockets: int
    version: str
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    # every request's latency (µs) when the run kept an access log (LoadSpec.access_log); empty
    # otherwise — in memory only, not in any document
    latencies_us: npt.NDArray[np.float64] = field(
        repr=False, compare=False, default_factory=lambda: np.zeros(0)
    )

    def quantiles(self, probs: Sequence[float]) -> list[float]:
        """Latency quantiles (µs) at ``probs``: of the requests' own latencies when the run kept
        them, else of fortio's histogram (:func:`histogram_quantiles`)."""
        if self.latencies_us.size:
            return [float(v) for v in np.quantile(self.latencies_us, np.asarray(probs))]
        return histogram_quantiles([self], probs)

    @property
    def p50_us(self) -> float:
        return self.percentiles_us[50.0]

    @property
    def p90_us(self) -> float:
        return self.percentiles_us[90.0]

    @property
    def p99_us(self) -> float:
        return self.percentiles_us[99.0]

    @property
    def ok(self) -> bool:
        return self.count > 0 and self.errors == 0


def parse_result(doc: Mapping[str, Any], spec: LoadSpec) -> LoadResult:
    """A :class:`LoadResult` from fortio's JSON output (pure)."""
    h = doc["DurationHistogram"]
    codes = {str(k): int(v) for k, v in (doc.get("RetCodes") or {}).items()}
    ok = sum(codes.get(c, 0) for c in _OK_CODES[spec.mode])
    count = int(h["Count"])
    err_hist = int((doc.get("ErrorsDurationHistogram") or {}).get("Count", 0))
    pct = {float(p["Percentile"]): float(p["Value"]) * 1e6 for p in h.get("Percentiles") or []}
    return LoadResult(
        spec=spec,
        count=count,
        errors=max(count - ok, err_hist),
        ret_codes=codes,
        actual_qps=float(doc.get("ActualQPS", 0.0)),
        duration_s=float(doc.get("ActualDuration", 0)) / 1e9,
        min_us=float(h["Min"]) * 1e6,
        avg_us=float(h["Avg"]) * 1e6,
        max_us=float(h["Max"]) * 1e6,
        stddev_us=float(h.get("StdDev", 0.0)) * 1e6,
        percentiles_us=pct,
        sockets=int(doc.get("SocketCount", len(doc.get("Sockets") or []))),
        version=str(doc.get("Version", "")),
        raw=dict(doc),
    )


def histogram_quantiles(results: Sequence[LoadResult], probs: Sequence[float]) -> list[float]:
    """Quantiles (µs) at ``probs`` of the latency histograms of ``results`` pooled (fortio's
    buckets, uniform within each as fortio interpolates; the first and last bucket run from
    the run's min and to its max). Pure."""
    edges: list[float] = []
    buckets: list[tuple[float, float, float]] = []
    for r in results:
        for b in r.raw.get("DurationHistogram", {}).get("Data") or []:
            lo, hi, n = float(b["Start"]) * 1e6, float(b["End"]) * 1e6, float(b["Count"])
            buckets.append((lo, max(hi, lo), n))
            edges += [lo, hi]
    if not buckets:
        raise FortioError("no latency histogram in the results")
    x = np.unique(np.asarray(edges))
    cdf = np.zeros_like(x)
    for lo, hi, n in buckets:  # the pooled CDF is linear between consecutive edges
        cdf += n * (np.clip((x - lo) / (hi - lo), 0.0, 1.0) if hi > lo else (x >= lo))
    cdf /= cdf[-1]
    keep = np.concatenate(([True], np.diff(cdf) > 0))  # flat stretches: their first point
    return [float(v) for v in np.interp(np.asarray(probs, dtype=np.float64), cdf[keep], x[keep])]


#: fortio's last finite bucket boundary, in units of the resolution (above: one open bucket)
HISTOGRAM_TOP_UNITS = 100_000


def beyond_histogram(result: LoadResult) -> list[float]:
    """The percentiles of ``result`` above fortio's last finite bucket (``offset +
    100 000 × resolution``): fortio interpolates them linearly up to the run's maximum, so
    they say where the maximum was, not where the percentile is. Pure."""
    top_us = (result.spec.offset_s + HISTOGRAM_TOP_UNITS * result.spec.resolution_s) * 1e6
    return sorted(p for p, v in result.percentiles_us.items() if v > top_us)


def check_result(result: LoadResult) -> LoadResult:
    """Raise :class:`LoadFailed` naming the failures unless every call succeeded."""
    if result.count == 0:
        raise LoadFailed(f"fortio made no calls to {result.spec.target}")
    if result.errors:
        bad = {c: n for c, n in result.ret_codes.items() if c not in _OK_CODES[result.spec.mode]}
        raise LoadFailed(
            f"{result.errors}/{result.count} calls to {result.spec.target} "
            f"({result.spec.mode.value}) failed: {bad}"
        )
    return result


def run_spec(
    spec: LoadSpec,
    system: System | None = None,
    place: Placement = Placement(),
    binary: Path | None = None,
) -> LoadResult:
    """Run fortio for ``spec``; raise :class:`LoadFailed` on any failed call."""
    system = system or RealSystem()
    argv = load_argv(spec, binary or fortio_binary())
    log = Path(spec.access_log) if spec.access_log else None
    if log is not None:
        log.unlink(missing_ok=True)  # fortio appends
    try:
        expected = spec.duration_s or (spec.n / spec.qps if spec.n and spec.qps > 0 else 0.0)
        budget = expected + spec.timeout_s * 2 + 60.0
        done = system.run(argv, place=place, check=False, timeout=budget)
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-5:])
            raise LoadFailed(f"fortio exited {done.returncode}: {tail}")
        try:
            doc = json.loads(done.stdout)
        except json.JSONDecodeError as e:
            raise FortioError(f"fortio printed no JSON result: {done.stdout[:200]!r}") from e
        result = parse_result(doc, spec)
        if log is not None:
            try:
                text = log.read_text()
            except OSError as e:
                raise FortioError(f"fortio wrote no access log {log}: {e}") from e
            lat = access_log_latencies_us(text)
            if len(lat) != result.count:
                raise FortioError(
                    f"fortio's access log has {len(lat)} requests, its result {result.count}"
                )
            result = replace(
                result,
                percentiles_us=exact_percentiles(lat, spec.percentiles),
                latencies_us=np.asarray(lat, dtype=np.float64),
            )
    finally:  # the log goes with the run, whatever became of it
        if log is not None:
            log.unlink(missing_ok=True)
    return check_result(result)


def access_log_latencies_us(text: str) -> list[float]:
    """Every request's latency (µs) from fortio's JSON access log (one object a line). Pure."""
    return [float(json.loads(line)["latency"]) * 1e6 for line in text.splitlines() if line.strip()]


def exact_percentiles(
    latencies_us: Sequence[float], percentiles: Sequence[float]
) -> dict[float, float]:
    """Percentiles of the requests' own latencies (linear between order statistics, as
    numpy's default), not of fortio's buckets. Pure."""
    if not latencies_us:
        raise FortioError("no latencies to take percentiles of")
    a = np.asarray(latencies_us, dtype=np.float64)
    return {float(p): float(np.percentile(a, p)) for p in percentiles}


def run_load(
    target: str,
    mode: Mode | str,
    size_bytes: int,
    qps: float,
    *,
    connections: int = 1,
    duration_s: float | None = None,
    n: int | None = None,
    system: System | None = None,
    place: Placement = Placement(),
    binary: Path | None = None,
    resolution_s: float = DEFAULT_RESOLUTION_S,
    timeout_s: float = 3.0,
    response_bytes: int = 0,
    access_log: str = "",
) -> LoadResult:
    """One load run against ``target`` (``host:port``); see :class:`LoadSpec`."""
    spec = LoadSpec(
        target=target,
        mode=Mode(mode),
        size_bytes=size_bytes,
        qps=qps,
        connections=connections,
        duration_s=duration_s,
        n=n,
        resolution_s=resolution_s,
        timeout_s=timeout_s,
        response_bytes=response_bytes,
        access_log=access_log,
    )
    return run_spec(spec, system, place, binary)


def measure_max_qps(
    target: str,
    mode: Mode | str,
    size_bytes: int,
    *,
    connections: int = 1,
    duration_s: float = 2.0,
    system: System | None = None,
    place: Placement = Placement(),
    binary: Path | None = None,
) -> float:
    """Highest sustained rate (closed loop, ``-qps 0``) with ``connections`` in flight."""
    r = run_load(
        target,
        mode,
        size_bytes,
        0.0,
        connections=connections,
        duration_s=duration_s,
        system=system,
        place=place,
        binary=binary,
    )
    return r.actual_qps


def server_argv(
    binary: Path,
    host: str = "127.0.0.1",
    http_port: int | str | None = None,
    grpc_port: int | str | None = None,
    tcp_port: int | str | None = None,
) -> list[str]:
    """``fortio server`` with only the requested echo servers (others ``disabled``); a ``str``
    port is a Unix socket path (fortio listens on a Unix socket for any address with a /)."""

    def port(p: int | str | None) -> str:
        if isinstance(p, str):
            if "/" not in p:
                raise ValueError(f"fortio listens on a Unix socket only at a path with '/': {p!r}")
            return p
        return "disabled" if p is None else f"{host}:{p}"

    return [
        str(binary),
        "server",
        "-http-port",
        port(http_port),
        "-grpc-port",
        port(grpc_port),
        "-tcp-port",
        port(tcp_port),
        "-udp-port",
        "disabled",
        "-redirect-port",
        "disabled",
        "-ui-path",
        "",
        # large echo bodies are allowed up to this size (default 256 KiB)
        "-maxpayloadsizekb",
        "65536",
        "-loglevel",
        "warning",
    ]


class FortioServer(Started):
    """A running ``fortio server`` (echo servers), placed; use as a context manager.

    Ready when each enabled server has logged ``listening on``; fortio prints those lines
    even at log level warning. A ``str`` port is a Unix socket path.
    """

    def __init__(
        self,
        system: System,
        workdir: Path,
        *,
        host: str = "127.0.0.1",
        http_port: int | str | None = None,
        grpc_port: int | str | None = None,
        tcp_port: int | str | None = None,
        place: Placement = Placement(),
        binary: Path | None = None,
    ) -> None:
        self.system = system
        self.workdir = workdir
        self.place = place
        self.ports = {"http-echo": http_port, "grpc": grpc_port, "tcp-echo": tcp_port}
        self.argv = server_argv(binary or fortio_binary(), host, http_port, grpc_port, tcp_port)
        self.log_path = workdir / "fortio-server.log"
        self.process: Process | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.process = self.system.spawn(
            self.argv, place=self.place, stdout=subprocess.DEVNULL, stderr=self._log
        )
        want = sum(p is not None for p in self.ports.values())
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise FortioError(f"fortio server exited {code}: {self._tail()}")
            if self._listening() >= want:
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise FortioError(f"fortio server not listening after {timeout}s: {self._tail()}")
            time.sleep(0.02)

    def _listening(self) -> int:
        if not self.log_path.exists():
            return 0
        return self.log_path.read_text(errors="replace").count("listening on")

    def _tail(self) -> str:
        if not self.log_path.exists():
            return ""
        return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-5:])

    def stop(self) -> int | None:
        code = self.process.stop() if self.process is not None else None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code
