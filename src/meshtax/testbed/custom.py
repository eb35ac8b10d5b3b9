"""A proxy the user brings (``meshtax profile --proxy-binary BIN --proxy-config TEMPLATE``):
its config is the user's template with the sidecar's addresses filled in (pure,
:class:`TemplateConfig`); the process is a :class:`~meshtax.testbed.fileproxy.FileProxy`.

Placeholders (``string.Template``: ``$name`` or ``${name}``; any other ``$word`` — nginx's
variables, shell's — is left as written): ``${inbound_port}`` (where the pod's inbound traffic
is redirected to, 15006), ``${outbound_port}`` (its outbound traffic, 15001), ``${app_host}``
and ``${app_port}`` (where the app listens: forward inbound traffic there), ``${mode}``
(``tcp``, ``http`` or ``grpc``: what the proxy must speak), ``${workdir}`` (a directory of
its own: pid files, logs, temp files). The command line is ``args`` with ``${binary}``,
``${config}`` (the rendered file) and ``${workdir}``; by default ``${binary} -c ${config}``.

The proxy runs as uid 1337 (interception exempts it), in the foreground, as one process (the
PID the probes and perf watch), and is ready once it listens on the inbound port (and the
outbound one, if the template uses it).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from string import Template

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import config_hash
from meshtax.testbed.system import System

__all__ = ["DEFAULT_ARGS", "TemplateConfig", "custom_version"]

DEFAULT_ARGS = "${binary} -c ${config}"


def custom_version(system: System, binary: Path | None) -> str:
    """The first line ``BIN --version`` prints (``unknown`` when it says nothing)."""
    if binary is None:
        return "unknown"
    done = system.run([str(binary), "--version"], check=False, timeout=30)
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return lines[0][:80] if done.returncode == 0 and lines else "unknown"


@dataclass(frozen=True)
class TemplateConfig:
    """One sidecar of a user's proxy: ``template`` rendered for ``mode`` and ``app``."""

    template: str
    args: str = ""
    mode: Mode = Mode.TCP
    app: tuple[str, int] = ("127.0.0.1", 9078)
    inbound_port: int = 15006
    outbound_port: int = 15001
    name: str = "proxy"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if "inbound_port" not in self.template:
            raise ValueError("the config template never says ${inbound_port}: nothing to proxy")

    def ports(self) -> tuple[int, ...]:
        out = "outbound_port" in self.template
        return (self.inbound_port, self.outbound_port) if out else (self.inbound_port,)

    def render(self, workdir: Path) -> str:
        return Template(self.template).safe_substitute(
            inbound_port=self.inbound_port,
            outbound_port=self.outbound_port,
            app_host=self.app[0],
            app_port=self.app[1],
            mode=self.mode.value,
            workdir=str(workdir),
        )

    def argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        text = Template(self.args or DEFAULT_ARGS).safe_substitute(
            binary=shlex.quote(str(binary)),
            config=shlex.quote(str(conf)),
            workdir=shlex.quote(str(workdir)),
        )
        return shlex.split(text)

    def check_argv(self, binary: Path, conf: Path, workdir: Path) -> list[str]:
        return ["true"]  # the proxy's own start says whether it took its config

    def key(self) -> str:
        """Hash of the rendered config and arguments with neutral addresses and paths, and
        the mode (what is on the wire shapes the work, whether the template says it or not)."""
        neutral = replace(self, app=("127.0.0.1", 1))
        return config_hash(
            {
                "mode": self.mode.value,
                "custom": neutral.render(Path("/w")),
                "args": neutral.argv(Path("/b"), Path("/c"), Path("/w")),
            }
        )
