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

Every process is started through :attr:`Testbed.registered`: recorded, stopped on close,
reaped after a crash.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.fortio import FortioServer, LoadResult, LoadSpec, run_spec
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.system import System
from meshtax.testbed.tools import tool

__all__ = [
    "APP_PORTS",
    "PROXY_UID",
    "SERVICE_PORT",
    "EchoBed",
    "echo_testbed",
    "mesh_pod",
    "start_sidecar",
]

#: the port clients call; the sidecar intercepts it and forwards to the app port
SERVICE_PORT = 8080
#: where the echo app listens (excluded from interception, so it is also the direct path)
APP_PORTS: Mapping[Mode, int] = {Mode.TCP: 9078, Mode.GRPC: 9079, Mode.HTTP: 9080}
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


@dataclass
class EchoBed:
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
    envoy_bin: Path
    fortio_bin: Path
    workdir: Path

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
    def app_pid(self) -> int:
        assert self.app.process is not None
        return self.app.process.pid

    @property
    def meshed_target(self) -> str:
        return f"{self.server.ip}:{SERVICE_PORT}"

    def direct_target(self, mode: Mode) -> str:
        return f"{self.server.ip}:{APP_PORTS[mode]}"

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
    ) -> LoadResult:
        """One fortio run from the client pod (pinned): closed loop when ``qps`` is 0;
        ``extra_args`` for fortio (``-uniform`` spreads fixed-rate calls over connections)."""
        spec = LoadSpec(
            target,
            mode,
            size,
            qps,
            connections=connections,
            duration_s=duration_s,
            n=n,
            extra_args=extra_args,
        )
        return run_spec(
            spec,
            self.testbed.system,
            self.client.place(cpus=self.pinning.client),
            self.fortio_bin,
        )

    def start_sidecar(
        self, mode: Mode, cfg: EnvoyConfig | None = None, *, name: str | None = None
    ) -> EnvoyProcess:
        """Start the server pod's sidecar; stop it when done. ``cfg`` defaults to the plain
        config of ``mode`` forwarding to the app's port; one sidecar at a time can own the
        intercepted ports."""
        cfg = cfg or EnvoyConfig(mode=mode, inbound_upstream=("127.0.0.1", APP_PORTS[mode]))
        return start_sidecar(
            self.testbed,
            self.server,
            cfg,
            self.workdir / (name or mode.value),
            cpus=self.pinning.sidecars,
            binary=self.envoy_bin,
        )


@contextmanager
def echo_testbed(
    tb: Testbed,
    pinning: Pinning,
    *,
    envoy_bin: Path | None = None,
    fortio_bin: Path | None = None,
) -> Iterator[EchoBed]:
    """Build the :class:`EchoBed` in the open testbed ``tb`` and yield it; the echo app is
    stopped on the way out (the testbed removes the rest when it closes)."""
    envoy_bin = envoy_bin or tool("envoy")
    fortio_bin = fortio_bin or tool("fortio")
    work = tb.scratch_dir("meshtax-profile-")
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
    try:
        yield EchoBed(tb, client, server, app, pinning, envoy_bin, fortio_bin, work)
    finally:
        app.stop()
