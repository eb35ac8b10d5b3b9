"""The one testbed set-up: meshed pods with a sidecar each, and the one-hop echo bed that the
profiler and the one-hop validation sweeps measure on.

One-hop bed (:func:`echo_testbed`)::

    pod client  (fortio load, no sidecar, CPU pinning.client)
       │ veth/bridge
    pod server  (meshed)  :8080 ──iptables──► sidecar :15006 (uid 1337, pinning.sidecars)
                                                 └─ 127.0.0.1:<app port> ─► fortio echo (pinning.app)
                          :<app port> (excluded from interception) ─► the same fortio echo

So "with sidecar" targets ``server:8080`` and "without" targets the app port directly: the
same echo process, in the same run. Multi-service apps (``meshtax validate``) use
:func:`mesh_pod` for each pod of their meshed copy.

The sidecar is the bed's :class:`~meshtax.model.proxy.ProxyChoice` (Envoy by default, or the
reference sidecar). With another IPC a second echo process in the server pod serves the same
three protocols for the meshed path, and the sidecar forwards to it::

    ipc uds:     sidecar :15006 ─► <sockets>/<mode>.sock ─► echo on Unix sockets
    ipc sockmap: sidecar :15006 ─► 127.0.0.1:<SOCKMAP_PORTS> ─► echo; both in one cgroup whose
                 sockets bpf/sockredir redirects socket to socket (sockmap/sk_msg)

while the direct path stays the TCP echo above (a client in another pod cannot reach a Unix
socket; redirection would change the direct path too); :attr:`EchoBed.meshed_app_pid` is the
app the meshed path reaches.

Every process is started through :attr:`Testbed.registered`: recorded, stopped on close,
reaped after a crash.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from meshtax.model.proxy import ProxyChoice, ProxyError
from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.fortio import FortioServer, LoadResult, LoadSpec, run_spec
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.proxy import PROXIES, Proxy, SidecarRequest, Upstream
from meshtax.testbed.system import Placement, System
from meshtax.testbed.tools import tool

__all__ = [
    "APP_PORTS",
    "ClientBed",
    "PROXY_UID",
    "SERVICE_PORT",
    "EchoBed",
    "OneHop",
    "echo_testbed",
    "mesh_pod",
    "start_sidecar",
]

#: the port clients call; the sidecar intercepts it and forwards to the app port
SERVICE_PORT = 8080
#: where the echo app listens (excluded from interception, so it is also the direct path)
APP_PORTS: Mapping[Mode, int] = {Mode.TCP: 9078, Mode.GRPC: 9079, Mode.HTTP: 9080}
#: where the meshed path's echo listens (on loopback) when sockmap redirects its sockets
SOCKMAP_PORTS: Mapping[Mode, int] = {Mode.TCP: 9178, Mode.GRPC: 9179, Mode.HTTP: 9180}
#: the sidecar's uid, exempt from interception (Istio's 1337)
PROXY_UID = 1337


def start_sidecar(
    tb: Testbed,
    pod: Pod,
    config: EnvoyConfig,
    workdir: Path,
    *,
    cpus: tuple[int, ...] | None = None,
    binary: Path | None = None,
) -> EnvoyProcess:
    """Start ``pod``'s sidecar (as :data:`PROXY_UID`, on ``cpus``); the testbed stops it on
    close if the caller does not."""
    envoy = EnvoyProcess(
        tb.registered, config, workdir, place=pod.place(cpus=cpus, uid=PROXY_UID), binary=binary
    )
    envoy.start()
    return envoy


def mesh_pod(
    tb: Testbed,
    pod: Pod,
    config: EnvoyConfig,
    workdir: Path,
    *,
    cpus: tuple[int, ...] | None = None,
    exclude_inbound_ports: tuple[int, ...] = (15000, 15090),
    binary: Path | None = None,
) -> EnvoyProcess:
    """Istio-style interception in ``pod`` and its sidecar, started."""
    tb.mesh(pod, proxy_uid=PROXY_UID, exclude_inbound_ports=exclude_inbound_ports)
    return start_sidecar(tb, pod, config, workdir, cpus=cpus, binary=binary)


class OneHop(Protocol):
    """What the profiler measures on: :class:`EchoBed`, or the node bed
    (:class:`~meshtax.testbed.nodebed.NodeBed`) whose proxies are per node and waypoints."""

    @property
    def system(self) -> System: ...

    @property
    def cpus(self) -> tuple[int, ...]: ...

    @property
    def app_pid(self) -> int: ...

    @property
    def meshed_app_pid(self) -> int: ...

    @property
    def path_pids(self) -> tuple[int, ...]:
        """Proxies on both paths besides the watched one (their change counts as the app's)."""
        ...

    @property
    def cpu_chain(self) -> bool:
        """Several busy proxies share the app's CPU on the meshed path: its components add
        on-CPU time, not wall time (:func:`~meshtax.profile.decompose.chain_breakdown`)."""
        ...

    @property
    def meshed_target(self) -> str: ...

    @property
    def client_netns_path(self) -> str: ...

    def direct_target(self, mode: Mode) -> str: ...

    def load(
        self,
        target: str,
        mode: Mode,
        size: int,
        qps: float = 0.0,
        *,
        duration_s: float | None = None,
        n: int | None = None,
        connections: int = 1,
        extra_args: tuple[str, ...] = (),
        access_log: str = "",
    ) -> LoadResult: ...

    def start_sidecar(
        self,
        mode: Mode,
        cfg: EnvoyConfig | None = None,
        *,
        name: str | None = None,
        app: Mode | None = None,
    ) -> Proxy: ...


class ClientBed:
    """What every bed does the same way: the load from its client pod, its CPUs, where its
    tools spawn (:class:`EchoBed`, :class:`~meshtax.testbed.nodebed.NodeBed`)."""

    testbed: Testbed
    client: Pod
    pinning: Pinning
    fortio_bin: Path

    @property
    def system(self) -> System:
        """Where tools started for this bed (probes, perf) spawn: the testbed's registry."""
        return self.testbed.registered

    @property
    def cpus(self) -> tuple[int, ...]:
        """The CPUs client, sidecars and app are pinned to (empty: unpinned, all of them)."""
        p = self.pinning
        sets = (p.client, p.sidecars, p.app)
        if any(c is None for c in sets):
            return ()
        return tuple(sorted({c for cs in sets if cs is not None for c in cs}))

    @property
    def client_netns_path(self) -> str:
        """The client pod's namespace file (what the probe follows to see the load generator)."""
        return f"/run/netns/{self.client.netns}"

    def load(
        self,
        target: str,
        mode: Mode,
        size: int,
        qps: float = 0.0,
        *,
        duration_s: float | None = None,
        n: int | None = None,
        connections: int = 1,
        extra_args: tuple[str, ...] = (),
        access_log: str = "",
    ) -> LoadResult:
        """One fortio run from the client pod (pinned): closed loop when ``qps`` is 0;
        ``extra_args`` for fortio (``-uniform`` spreads fixed-rate calls over connections);
        ``access_log``: a file for every request's latency (:attr:`LoadSpec.access_log`)."""
        spec = LoadSpec(
            target,
            mode,
            size,
            qps,
            connections=connections,
            duration_s=duration_s,
            n=n,
            extra_args=extra_args,
            access_log=access_log,
        )
        return run_spec(
            spec,
            self.testbed.system,
            self.client.place(cpus=self.pinning.client),
            self.fortio_bin,
        )


@dataclass
class EchoBed(ClientBed):
    """A running one-hop testbed: a client pod, a meshed server pod (app ports excluded from
    interception) and the fortio echo app serving TCP, HTTP and gRPC in it.

    ``meshed_target`` goes through a sidecar started with :meth:`start_sidecar`;
    ``direct_target(mode)`` reaches the same app process without it.
    """

    testbed: Testbed
    client: Pod
    server: Pod
    app: FortioServer
    pinning: Pinning
    envoy_bin: Path | None  # None: the default Envoy (a bed of another proxy may have none)
    fortio_bin: Path
    workdir: Path
    proxy: ProxyChoice = ProxyChoice()
    proxy_bin: Path | None = None  # the chosen proxy's binary (None: its tool's default)
    meshed_app: FortioServer | None = None  # the meshed path's own echo (ipc uds, sockmap)
    sockets: Path | None = None  # where the Unix sockets live (ipc uds)
    cgroup: str | None = None  # the cgroup of sidecar and meshed echo (ipc sockmap)

    @property
    def app_pid(self) -> int:
        """The TCP echo: what the direct path reaches (and the meshed one with ipc tcp)."""
        assert self.app.process is not None
        return self.app.process.pid

    @property
    def path_pids(self) -> tuple[int, ...]:
        """None here: the sidecar is the only proxy."""
        return ()

    @property
    def cpu_chain(self) -> bool:
        return False

    @property
    def meshed_app_pid(self) -> int:
        """The echo process the sidecar forwards to."""
        if self.meshed_app is None:
            return self.app_pid
        assert self.meshed_app.process is not None
        return self.meshed_app.process.pid

    def app_address(self, mode: Mode) -> Upstream:
        """Where the sidecar sends ``mode``'s traffic: the app's port on loopback, or its
        Unix socket."""
        if self.sockets is not None:
            return str(self.sockets / f"{mode.value}.sock")
        return ("127.0.0.1", (SOCKMAP_PORTS if self.cgroup else APP_PORTS)[mode])

    @property
    def meshed_target(self) -> str:
        return f"{self.server.ip}:{SERVICE_PORT}"

    def direct_target(self, mode: Mode) -> str:
        return f"{self.server.ip}:{APP_PORTS[mode]}"

    def start_sidecar(
        self,
        mode: Mode,
        cfg: EnvoyConfig | None = None,
        *,
        name: str | None = None,
        app: Mode | None = None,
    ) -> Proxy:
        """Start the server pod's sidecar (the bed's proxy); stop it when done. It runs in
        ``mode`` and forwards to the app's server of ``app`` (default: ``mode``; a tcp-mode
        sidecar can carry another protocol). ``cfg``: an Envoy config of the caller's
        (filters, TLS) instead of the plain one — Envoy only. One sidecar at a time can own
        the intercepted ports."""
        workdir = self.workdir / (name or mode.value)
        if cfg is not None:
            if self.proxy.kind != "envoy":
                raise ProxyError(f"an Envoy config given to a {self.proxy.kind} bed")
            return start_sidecar(
                self.testbed,
                self.server,
                cfg,
                workdir,
                cpus=self.pinning.sidecars,
                binary=self.envoy_bin,
            )
        self.proxy.check_modes([mode])
        binary = self.envoy_bin if self.proxy.kind == "envoy" else self.proxy_bin
        req = SidecarRequest(
            mode,
            self.app_address(app or mode),
            self.proxy,
            workdir,
            replace(
                self.server.place(cpus=self.pinning.sidecars, uid=PROXY_UID), cgroup=self.cgroup
            ),
            binary,
            outbound=None if self.sockets is None else str(self.sockets / "outbound.sock"),
        )
        px = PROXIES[self.proxy.kind].build(self.testbed.registered, req)
        px.start()
        return px


@contextmanager
def echo_testbed(
    tb: Testbed,
    pinning: Pinning,
    *,
    envoy_bin: Path | None = None,
    fortio_bin: Path | None = None,
    proxy: ProxyChoice = ProxyChoice(),
    proxy_bin: Path | None = None,
) -> Iterator[EchoBed]:
    """Build the :class:`EchoBed` in the open testbed ``tb`` and yield it; the echo apps are
    stopped on the way out (the testbed removes the rest when it closes). ``proxy``: the
    sidecar :meth:`EchoBed.start_sidecar` runs (``proxy_bin``: its binary, if not Envoy)."""
    if proxy.kind == "envoy":
        envoy_bin = envoy_bin or tool("envoy")
    fortio_bin = fortio_bin or tool("fortio")
    if proxy.kind != "envoy":
        proxy_bin = proxy_bin or PROXIES[proxy.kind].binary(proxy)
    work = tb.scratch_dir("meshtax-profile-")
    if PROXIES[proxy.kind].file_configured:
        # the proxy's uid reaches its own work directory below (the bed's files stay root's)
        tb.system.run(["chmod", "0711", str(work)])
    client = tb.add_pod("client")
    server = tb.add_pod("server")
    tb.mesh(server, proxy_uid=PROXY_UID, exclude_inbound_ports=(15000, 15090, *APP_PORTS.values()))
    app = FortioServer(
        tb.registered,
        work / "app",
        host="0.0.0.0",
        http_port=APP_PORTS[Mode.HTTP],
        grpc_port=APP_PORTS[Mode.GRPC],
        tcp_port=APP_PORTS[Mode.TCP],
        place=server.place(cpus=pinning.app),
        binary=fortio_bin,
    )
    app.start()
    with ExitStack() as stack:
        stack.callback(app.stop)
        sockets = cgroup = None
        meshed = server.place(cpus=pinning.app)
        if proxy.ipc == "uds":
            sockets = _uds_dir(tb)
        elif proxy.ipc == "sockmap":
            cgroup = _sockmap(tb, stack, work)
            meshed = replace(meshed, cgroup=cgroup)
        meshed_app = None
        if proxy.ipc != "tcp":
            meshed_app = _meshed_echo(tb, work / "app-meshed", meshed, fortio_bin, sockets)
            stack.callback(meshed_app.stop)
        yield EchoBed(
            tb,
            client,
            server,
            app,
            pinning,
            envoy_bin,
            fortio_bin,
            work,
            proxy,
            proxy_bin,
            meshed_app,
            sockets,
            cgroup,
        )


def _uds_dir(tb: Testbed) -> Path:
    """A directory the proxy's uid may create its own socket in (and traverse)."""
    sockets = tb.scratch_dir("meshtax-uds-")
    tb.system.run(["chown", f"{PROXY_UID}:{PROXY_UID}", str(sockets)])
    tb.system.run(["chmod", "0755", str(sockets)])
    return sockets


def _meshed_echo(
    tb: Testbed, logdir: Path, place: Placement, fortio_bin: Path, sockets: Path | None
) -> FortioServer:
    """The meshed path's echo: on Unix sockets in ``sockets`` (which the proxy's uid may
    connect to: connect needs write access, Go creates them 0777 & ~umask), else on
    127.0.0.1:SOCKMAP_PORTS."""
    ports: dict[Mode, int | str] = (
        dict(SOCKMAP_PORTS)
        if sockets is None
        else {m: str(sockets / f"{m.value}.sock") for m in Mode}
    )
    app = FortioServer(
        tb.registered,
        logdir,
        http_port=ports[Mode.HTTP],
        grpc_port=ports[Mode.GRPC],
        tcp_port=ports[Mode.TCP],
        place=place,
        binary=fortio_bin,
    )
    app.start()
    if sockets is not None:
        tb.system.run(["chmod", "0666", *(str(p) for p in ports.values())])
    return app


def _sockmap(tb: Testbed, stack: ExitStack, work: Path, mounts: str = "/proc/mounts") -> str:
    """A cgroup whose TCP sockets ``bpf/sockredir`` redirects socket to socket (removed on the
    way out, after its processes: the sidecar's caller stops it first)."""
    root = next(
        (
            ln.split()[1]
            for ln in Path(mounts).read_text().splitlines()
            if ln.split()[2] == "cgroup2"
        ),
        None,
    )
    if root is None:
        raise ProxyError("ipc sockmap needs a cgroup-v2 mount (none in /proc/mounts)")
    cgroup = f"{root}/meshtax-{tb.run_id}-sockmap"
    tb.system.run(["mkdir", cgroup])
    stack.callback(tb.system.run, ["rmdir", cgroup], check=False)
    log = work / "sockredir.log"
    with open(log, "wb") as err, open(work / "sockredir.json", "wb") as out:
        redir = tb.registered.spawn([str(tool("sockredir")), "-c", cgroup], stdout=out, stderr=err)
    stack.callback(redir.stop)
    deadline = time.monotonic() + 10.0
    while "sockredir: ready" not in log.read_text(errors="replace"):
        if redir.poll() is not None or time.monotonic() > deadline:
            raise ProxyError(f"sockredir did not attach: {log.read_text(errors='replace')[-300:]}")
        time.sleep(0.02)
    return cgroup
