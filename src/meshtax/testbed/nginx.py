"""nginx as a sidecar: its config (pure, :class:`NginxConfig`) and version; the process is a
:class:`~meshtax.testbed.fileproxy.FileProxy`.

Laid out as Istio lays out Envoy: an inbound listener on 15006 forwarding to the app, an
outbound listener on 15001. nginx cannot recover the **original destination** of a redirected
connection (it never asks for ``SO_ORIGINAL_DST``; ``$server_addr:$server_port`` is the
redirected address, the listener's own), so each listener forwards to **one fixed upstream**:
the inbound one to the pod's app (enough for the one-hop bed, as for every sidecar: the app's
port is known), the outbound one to ``outbound_upstream`` when given (else it refuses the
connection). A multi-service app would need a listener per destination and a per-port
redirect rule (or, in http mode, routing by ``Host`` with a resolver), which the testbed does
not build. ``tcp`` mode is the stream module (``libnginx-mod-stream``), ``http`` proxies
HTTP/1.1 with upstream keep-alive and bodies streamed (no request or response buffering),
``grpc`` is ``http2`` cleartext in and ``grpc_pass`` out.
One process (``master_process off``), one worker connection loop, no access log.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import config_hash
from meshtax.testbed.system import System
from meshtax.testbed.tools import tool

__all__ = ["STREAM_MODULE", "NginxConfig", "nginx_version", "parse_version"]

#: Debian's dynamic stream module (package libnginx-mod-stream)
STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")


def parse_version(text: str) -> str:
    """``nginx version: nginx/1.22.1`` → ``1.22.1``."""
    for line in text.splitlines():
        if "nginx/" in line:
            return line.split("nginx/", 1)[1].split()[0]
    raise ValueError(f"cannot parse nginx's version from {text[:80]!r}")


def nginx_version(system: System, binary: Path | None = None) -> str:
    """nginx's version (``nginx -v`` prints on stderr)."""
    done = system.run([str(binary or tool("nginx")), "-v"])
    return parse_version(done.stderr + done.stdout)


@dataclass(frozen=True)
class NginxConfig:
    """One nginx sidecar. ``app``: the inbound listener's upstream; ``outbound_upstream``: the
    outbound listener's (None: no upstream, connections to it are refused)."""

    mode: Mode = Mode.TCP
    app: tuple[str, int] = ("127.0.0.1", 9078)
    outbound_upstream: tuple[str, int] | None = None
    inbound_port: int = 15006
    outbound_port: int = 15001
    timeout_s: int = 300
    stream_module: Path = STREAM_MODULE
    name: str = "nginx"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))

    def ports(self) -> tuple[int, ...]:
        return (self.inbound_port, self.outbound_port)

    def _outbound(self) -> str:
        up = self.outbound_upstream
        return "127.0.0.1:1" if up is None else f"{up[0]}:{up[1]}"  # :1 refuses

    def render(self, workdir: Path) -> str:
        w = workdir
        t = f"{self.timeout_s}s"
        head = [
            *([f"load_module {self.stream_module};"] if self.mode is Mode.TCP else []),
            "daemon off;",
            "master_process off;",
            "worker_processes 1;",
            f"pid {w / 'nginx.pid'};",
            f"error_log {w / 'nginx.log'} warn;",
            "events { worker_connections 8192; }",
        ]
        if self.mode is Mode.TCP:
            body = [
                "stream {",
                f"  proxy_timeout {t};",
                "  proxy_connect_timeout 1s;",
                f"  server {{ listen {self.inbound_port}; "
                f"proxy_pass {self.app[0]}:{self.app[1]}; }}",
                f"  server {{ listen {self.outbound_port}; proxy_pass {self._outbound()}; }}",
                "}",
            ]
            return "\n".join([*head, *body, ""])
        grpc = self.mode is Mode.GRPC
        listen = " http2" if grpc else ""
        temp = [
            f"  {k}_temp_path {w / k};"
            for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        ]

        def location(up: str) -> str:
            if grpc:
                return f"location / {{ grpc_pass grpc://{up}; }}"
            # streamed both ways, as a sidecar does: nginx's default buffers bodies over
            # 16 KB to a temp file (measured: 64 KB requests took 45 ms instead of ~1 ms)
            return (
                f"location / {{ proxy_pass http://{up}; proxy_http_version 1.1; "
                'proxy_set_header Connection ""; '
                "proxy_request_buffering off; proxy_buffering off; }"
            )

        app = f"{self.app[0]}:{self.app[1]}"
        body = [
            "http {",
            "  access_log off;",
            *temp,
            f"  keepalive_timeout {t};",
            "  keepalive_requests 100000000;",
            f"  client_body_timeout {t};",
            f"  send_timeout {t};",
            f"  proxy_read_timeout {t};",
            f"  grpc_read_timeout {t};",
            "  client_max_body_size 0;",
            f"  upstream app {{ server {app}; keepalive 64; keepalive_requests 100000000; }}",
            f"  upstream out {{ server {self._outbound()}; keepalive 64; }}",
            f"  server {{ listen {self.inbound_port}{listen}; {location('app')} }}",
            f"  server {{ listen {self.outbound_port}{listen}; {location('out')} }}",
            "}",
        ]
        return "\n".join([*head, *body, ""])

    def argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        # -e: the error log before the config is read (the default, /var/log/nginx, is root's)
        return [str(binary), "-p", str(workdir), "-e", str(workdir / "nginx.log"), "-c", str(conf)]

    def check_argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        return [*self.argv(binary, conf, workdir), "-t", "-q"]

    def key(self) -> str:
        """Hash of the config with neutral addresses, ports and paths."""
        neutral = replace(
            self,
            app=("a", 1),
            outbound_upstream=None if self.outbound_upstream is None else ("o", 1),
            inbound_port=15006,
            outbound_port=15001,
        )
        return config_hash({"nginx": neutral.render(Path("/w"))})
