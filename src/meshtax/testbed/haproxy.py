"""HAProxy as a sidecar: its config (pure, :class:`HaproxyConfig`) and version; the process is
a :class:`~meshtax.testbed.fileproxy.FileProxy`.

Laid out as Istio lays out Envoy: an inbound frontend on 15006 forwarding to the app, an
outbound frontend on 15001. HAProxy recovers the **original destination** of a redirected
connection: a server address of ``0.0.0.0`` with no port means "where the client connected",
which HAProxy's Linux build (``+NETFILTER``) reads with ``SO_ORIGINAL_DST`` — so, like Envoy's
``ORIGINAL_DST`` cluster, one outbound frontend serves every destination of a multi-service
app. One thread (``nbthread 1``), foreground, no master process, no logging (Envoy's sidecar
logs nothing either); ``tcp`` mode forwards bytes, ``http`` parses HTTP/1.1 (keep-alive both
ways), ``grpc`` is HTTP/2 both ways (``proto h2``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import config_hash
from meshtax.testbed.system import System
from meshtax.testbed.tools import tool

__all__ = ["HaproxyConfig", "haproxy_version", "parse_version"]


def parse_version(text: str) -> str:
    """``HAProxy version 2.6.12-1+deb12u4 2026/10/17 - …`` → ``2.6.12``."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in ("HAProxy", "HA-Proxy") and parts[1] == "version":
            return parts[2].split("-")[0]
    raise ValueError(f"cannot parse HAProxy's version from {text[:80]!r}")


def haproxy_version(system: System, binary: Path | None = None) -> str:
    """HAProxy's version (``haproxy -v``)."""
    return parse_version(system.run([str(binary or tool("haproxy")), "-v"]).stdout)


@dataclass(frozen=True)
class HaproxyConfig:
    """One HAProxy sidecar. ``app``: where inbound traffic goes (None: the original
    destination); ``outbound_upstream``: None forwards outbound traffic to its original
    destination."""

    mode: Mode = Mode.TCP
    app: tuple[str, int] | None = None
    outbound_upstream: tuple[str, int] | None = None
    inbound_port: int = 15006
    outbound_port: int = 15001
    timeout_s: int = 300
    name: str = "haproxy"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))

    def ports(self) -> tuple[int, ...]:
        return (self.inbound_port, self.outbound_port)

    def render(self, workdir: Path) -> str:
        h2 = " proto h2" if self.mode is Mode.GRPC else ""
        mode = "tcp" if self.mode is Mode.TCP else "http"

        def server(up: tuple[str, int] | None) -> str:
            # 0.0.0.0 without a port: the connection's original destination (SO_ORIGINAL_DST)
            return "0.0.0.0" if up is None else f"{up[0]}:{up[1]}"

        t = f"{self.timeout_s}s"
        return "\n".join(
            [
                "global",
                "    nbthread 1",
                "    maxconn 8192",
                "defaults",
                f"    mode {mode}",
                "    timeout connect 1s",
                f"    timeout client {t}",
                f"    timeout server {t}",
                f"    timeout http-keep-alive {t}",
                "frontend inbound",
                f"    bind 0.0.0.0:{self.inbound_port}{h2}",
                "    default_backend inbound_app",
                "backend inbound_app",
                f"    server app {server(self.app)}{h2}",
                "frontend outbound",
                f"    bind 0.0.0.0:{self.outbound_port}{h2}",
                "    default_backend outbound_dst",
                "backend outbound_dst",
                f"    server dst {server(self.outbound_upstream)}{h2}",
                "",
            ]
        )

    def argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        # -db: foreground, no daemon; -Ws/-W not given: no master process, one PID to probe
        return [str(binary), "-db", "-f", str(conf)]

    def check_argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        return [str(binary), "-c", "-f", str(conf)]

    def key(self) -> str:
        """Hash of the config with neutral addresses and ports (a static app and the
        original destination differ)."""
        neutral = replace(
            self,
            app=None if self.app is None else ("a", 1),
            outbound_upstream=None if self.outbound_upstream is None else ("o", 1),
            inbound_port=15006,
            outbound_port=15001,
        )
        return config_hash({"haproxy": neutral.render(Path("/w"))})
