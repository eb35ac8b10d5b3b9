"""The sidecar proxy a measurement runs, behind one small interface.

A :class:`ProxyKind` per name of :data:`~meshtax.model.proxy.TRAITS` (what the proxy can do):
how its version is read, how the sidecar process that forwards a pod's inbound traffic to its
app is built, and the key of that sidecar's config (part of a profile's platform). A built
sidecar is a :class:`Proxy` — Envoy's :class:`~meshtax.testbed.envoy.process.EnvoyProcess`,
the reference sidecar's :class:`~meshtax.testbed.refsidecar.RefsidecarProcess`, or HAProxy's
and nginx's :class:`~meshtax.testbed.fileproxy.FileProxy`.

Adding a proxy (HAProxy, nginx, a per-node proxy, a user's binary):

1. ``model/proxy.py``: its :class:`~meshtax.model.proxy.ProxyTraits` in ``TRAITS`` — the
   modes it runs (an L4 proxy: tcp only; the profiler refuses the others before anything
   starts), the IPC variants (``tcp``; ``uds`` if it can forward to a Unix socket and listen
   on one; ``sockmap`` needs nothing of the proxy) and write variants (``copy``).
2. ``testbed/tools.py``: its name in ``Tool``/``TOOLS``, where the project installs it
   (``INSTALLED``) and how to install it (``FIX``); ``$MESHTAX_<NAME>`` overrides.
3. ``testbed/<proxy>.py``: a config (pure: argv or a config file's text from a
   :class:`SidecarRequest` — the mode, the app's :data:`Upstream`, the outbound socket path
   with ``uds``) and a process class taking a ``System`` that satisfies :class:`Proxy`:
   ``start()`` returns once its listeners are open (inbound on 15006, outbound on 15001, as
   Istio lays a sidecar out; it runs as uid 1337, which interception exempts, on the
   :class:`~meshtax.testbed.system.Placement` given), ``stop()`` ends it and returns its exit
   status, ``pid`` is what the probe and perf watch (a multi-process proxy: the worker's).
4. Here: one :class:`ProxyKind` in :data:`PROXIES` — ``tool``, ``version(system, binary)``,
   ``build(system, request)`` and ``key(mode, choice)`` (a hash of what shapes the proxy's work,
   not of addresses or paths: :func:`family_keys` puts every mode's key in the profile's
   ``config_hash``).

``meshtax profile --proxy NAME`` (its choices come from ``TRAITS``), the one-hop bed
(:meth:`~meshtax.testbed.bed.EchoBed.start_sidecar`) and the profiler then run it unchanged,
and the profile's platform records proxy, version and variant (``tests/testbed/test_proxy.py``
checks that every name of ``TRAITS`` has a kind, a tool and distinct keys per variant).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meshtax.model.proxy import ProxyChoice, ProxyError
from meshtax.model.sidecar import Mode
from meshtax.testbed.custom import TemplateConfig, custom_version
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess, envoy_version
from meshtax.testbed.fileproxy import FileProxy
from meshtax.testbed.haproxy import HaproxyConfig, haproxy_version
from meshtax.testbed.nginx import NginxConfig, nginx_version
from meshtax.testbed.refsidecar import RefsidecarConfig, RefsidecarProcess, refsidecar_version
from meshtax.testbed.system import Placement, System
from meshtax.testbed.tools import Tool, tool

__all__ = ["PROXIES", "Proxy", "ProxyKind", "SidecarRequest", "Upstream", "family_keys"]

#: where a sidecar sends inbound traffic: ``(host, port)`` or a Unix socket path
Upstream = tuple[str, int] | str


class Proxy(Protocol):
    """A sidecar process: start it, stop it, its PID, and the config it was given."""

    @property
    def pid(self) -> int: ...

    @property
    def config(self) -> object: ...

    def start(self) -> None: ...

    def stop(self) -> int | None: ...


@dataclass(frozen=True)
class SidecarRequest:
    """What the bed asks of a proxy kind: a ``mode`` sidecar forwarding inbound traffic to
    ``app``; ``outbound``: its outbound listener's socket path when the IPC is Unix sockets."""

    mode: Mode
    app: Upstream
    choice: ProxyChoice
    workdir: Path
    place: Placement = Placement()
    binary: Path | None = None
    outbound: str | None = None


@dataclass(frozen=True)
class ProxyKind:
    """How the testbed runs one proxy (see the module docstring)."""

    tool: Tool | None  # None: the user's binary (a proxy they bring)
    version: Callable[[System, Path | None], str]
    build: Callable[[System, SidecarRequest], Proxy]
    key: Callable[[Mode, ProxyChoice], str]
    #: it reads its config and writes its files in its work directory, as the proxy's uid
    file_configured: bool = False

    def binary(self, choice: ProxyChoice) -> Path:
        """The chosen proxy's program: the project's tool, or the user's binary."""
        return tool(self.tool) if self.tool is not None else Path(choice.binary)


def family_keys(choice: ProxyChoice) -> dict[str, str]:
    """The config key of the chosen sidecar in each mode its proxy has (a profile's key must
    not depend on which modes a run chose); sockmap redirection is set up around the proxy,
    not in its config, so it is named here."""
    kind = PROXIES[choice.kind]
    keys = {m.value: kind.key(m, choice) for m in choice.traits.modes}
    return {**keys, "ipc": "sockmap"} if choice.ipc == "sockmap" else keys


_PIPE = "/uds"  # a neutral socket path: keys do not depend on where sockets live


def _envoy(system: System, r: SidecarRequest) -> Proxy:
    uds = r.choice.ipc == "uds"
    cfg = EnvoyConfig(
        mode=r.mode, inbound_upstream=r.app, outbound_pipe=r.outbound if uds else None
    )
    return EnvoyProcess(system, cfg, r.workdir, place=r.place, binary=r.binary)


def _envoy_key(mode: Mode, choice: ProxyChoice) -> str:
    pipe = _PIPE if choice.ipc == "uds" else None
    return EnvoyConfig(mode=mode, inbound_upstream=pipe, outbound_pipe=pipe).key()


def _refsidecar_config(app: Upstream, outbound: str | None, c: ProxyChoice) -> RefsidecarConfig:
    uds = c.ipc == "uds"  # sockmap: plain TCP as far as the proxy knows
    return RefsidecarConfig(
        app=app,
        outbound=(outbound or _PIPE) if uds else "0.0.0.0:15001",
        ipc="uds" if uds else "tcp",
        write=c.write,
        zerocopy_min=c.zerocopy_min,
    )


def _refsidecar(system: System, r: SidecarRequest) -> Proxy:
    cfg = _refsidecar_config(r.app, r.outbound, r.choice)
    return RefsidecarProcess(system, cfg, r.workdir, r.place, r.binary)


def _refsidecar_key(mode: Mode, choice: ProxyChoice) -> str:
    app: Upstream = _PIPE if choice.ipc == "uds" else ("127.0.0.1", 1)
    return _refsidecar_config(app, None, choice).key()


def _static_app(r: SidecarRequest) -> tuple[str, int]:
    if isinstance(r.app, str):
        raise ProxyError(f"{r.choice.kind} forwards to host:port, not a Unix socket ({r.app})")
    return r.app


def _haproxy(system: System, r: SidecarRequest) -> Proxy:
    cfg = HaproxyConfig(mode=r.mode, app=_static_app(r))
    return FileProxy(system, cfg, r.workdir, r.place, r.binary)


def _haproxy_key(mode: Mode, choice: ProxyChoice) -> str:
    return HaproxyConfig(mode=mode, app=("127.0.0.1", 1)).key()


def _nginx(system: System, r: SidecarRequest) -> Proxy:
    cfg = NginxConfig(mode=r.mode, app=_static_app(r))
    return FileProxy(system, cfg, r.workdir, r.place, r.binary)


def _nginx_key(mode: Mode, choice: ProxyChoice) -> str:
    return NginxConfig(mode=mode).key()


def _custom_config(mode: Mode, app: tuple[str, int], c: ProxyChoice) -> TemplateConfig:
    return TemplateConfig(c.template, c.args, mode, app, name=c.name or "proxy")


def _custom(system: System, r: SidecarRequest) -> Proxy:
    cfg = _custom_config(r.mode, _static_app(r), r.choice)
    return FileProxy(system, cfg, r.workdir, r.place, r.binary)


def _custom_key(mode: Mode, choice: ProxyChoice) -> str:
    return _custom_config(mode, ("127.0.0.1", 1), choice).key()


#: how the testbed runs each proxy of :data:`~meshtax.model.proxy.TRAITS`
PROXIES: dict[str, ProxyKind] = {
    "envoy": ProxyKind("envoy", envoy_version, _envoy, _envoy_key),
    "refsidecar": ProxyKind("refsidecar", refsidecar_version, _refsidecar, _refsidecar_key),
    "haproxy": ProxyKind("haproxy", haproxy_version, _haproxy, _haproxy_key, True),
    "nginx": ProxyKind("nginx", nginx_version, _nginx, _nginx_key, True),
    "custom": ProxyKind(None, custom_version, _custom, _custom_key, True),
}
