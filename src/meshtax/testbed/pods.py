"""Network-namespace "pods" on a private bridge, with Istio-style traffic interception.

Topology of one run (``<id>`` is a short run id, so two runs never collide)::

    netns mtx-<id>-bridge:  br0 ── veth1 ── veth2 ── …          (nothing in the root netns)
                                    │        │
    netns mtx-<id>-client:  eth0 10.77.0.2/24, lo
    netns mtx-<id>-server:  eth0 10.77.0.3/24, lo   (+ istio nat rules if meshed)

Everything is registered in :mod:`meshtax.testbed.runstate` before it exists, and removed on
close, on exceptions, on Ctrl-C and on SIGTERM; a SIGKILLed run is reaped by the next one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from meshtax.testbed.runstate import (
    NETNS_PREFIX,
    RUN_ENV,
    STATE_DIR,
    ProcOps,
    ProcRecord,
    RealProcOps,
    ReapReport,
    Registry,
    RunLock,
    RunState,
    delete_netns,
    netns_pids,
    owned_tempdir,
    reap,
)
from meshtax.testbed.system import Completed, Placement, Process, System

BRIDGE = "br0"
POD_IF = "eth0"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")
_RUN_ID_RE = re.compile(r"^[a-z0-9]{1,8}$")


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM while a testbed is open, so cleanup runs."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


class CleanupError(RuntimeError):
    """Some teardown steps failed; every other step still ran."""


@dataclass(frozen=True)
class Pod:
    """A network namespace with one address on the testbed's private subnet."""

    name: str
    netns: str
    ip: str
    ifname: str = POD_IF
    node: str | None = None  # the node it runs on (:mod:`meshtax.testbed.nodes`); None: the bridge

    def place(
        self, *, cpus: tuple[int, ...] | None = None, uid: int | None = None, gid: int | None = None
    ) -> Placement:
        """A :class:`Placement` that runs inside this pod."""
        return Placement(netns=self.netns, cpus=cpus, uid=uid, gid=gid)


@dataclass(frozen=True)
class Interception:
    """Istio-style (istio-iptables) redirection of a pod's TCP traffic to its sidecar.

    Inbound TCP (PREROUTING) goes to ``inbound_port`` except ``exclude_inbound_ports``;
    outbound TCP (OUTPUT) goes to ``outbound_port`` except traffic of the proxy's uid/gid,
    traffic to 127.0.0.1, loopback traffic of the app, and ``exclude_outbound_ports``. As in
    Istio, the proxy must connect to its local app via 127.0.0.1 or from source 127.0.0.6.
    """

    inbound_port: int = 15006
    outbound_port: int = 15001
    proxy_uid: int = 1337
    proxy_gid: int = 1337
    exclude_inbound_ports: tuple[int, ...] = (15000, 15090)
    exclude_outbound_ports: tuple[int, ...] = ()
    inbound_passthrough_source: str = "127.0.0.6"


def istio_rules(c: Interception) -> list[list[str]]:
    """The iptables commands (nat table) that install ``c``, in order (mirrors istio-iptables)."""
    nat = ["iptables", "-w", "-t", "nat"]
    uid, gid = str(c.proxy_uid), str(c.proxy_gid)
    r: list[list[str]] = [
        nat + ["-N", "ISTIO_INBOUND"],
        nat + ["-N", "ISTIO_REDIRECT"],
        nat + ["-N", "ISTIO_IN_REDIRECT"],
        nat + ["-N", "ISTIO_OUTPUT"],
        nat
        + [
            "-A",
            "ISTIO_REDIRECT",
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-ports",
            str(c.outbound_port),
        ],
        nat
        + [
            "-A",
            "ISTIO_IN_REDIRECT",
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-ports",
            str(c.inbound_port),
        ],
        # inbound
        nat + ["-A", "PREROUTING", "-p", "tcp", "-j", "ISTIO_INBOUND"],
    ]
    for port in c.exclude_inbound_ports:
        r.append(nat + ["-A", "ISTIO_INBOUND", "-p", "tcp", "--dport", str(port), "-j", "RETURN"])
    r += [
        nat + ["-A", "ISTIO_INBOUND", "-p", "tcp", "-j", "ISTIO_IN_REDIRECT"],
        # outbound
        nat + ["-A", "OUTPUT", "-p", "tcp", "-j", "ISTIO_OUTPUT"],
    ]
    for port in c.exclude_outbound_ports:
        r.append(nat + ["-A", "ISTIO_OUTPUT", "-p", "tcp", "--dport", str(port), "-j", "RETURN"])
    out = [*nat, "-A", "ISTIO_OUTPUT"]
    # the proxy's inbound passthrough connects from 127.0.0.6: never loop it back
    r.append(out + ["-o", "lo", "-s", f"{c.inbound_passthrough_source}/32", "-j", "RETURN"])
    for owner in (["--uid-owner", uid], ["--gid-owner", gid]):
        r += [
            # the proxy calling its own pod IP over lo is inbound traffic for itself
            out
            + ["-o", "lo", "!", "-d", "127.0.0.1/32", "-m", "owner", *owner]
            + ["-j", "ISTIO_IN_REDIRECT"],
            # anyone else's traffic over lo is left alone
            out + ["-o", "lo", "-m", "owner", "!", *owner, "-j", "RETURN"],
            # the proxy's own outbound connections go out as they are (no loop)
            out + ["-m", "owner", *owner, "-j", "RETURN"],
        ]
    r += [
        out + ["-d", "127.0.0.1/32", "-j", "RETURN"],
        out + ["-j", "ISTIO_REDIRECT"],
    ]
    return r


def new_run_id() -> str:
    return secrets.token_hex(3)


class Testbed:
    """Pods on a private bridge for one profiling run; a context manager.

    ``open`` takes the exclusive run lock (waiting up to ``lock_timeout`` seconds), reaps
    leftovers of dead runs, and creates the bridge namespace. ``close`` stops every spawned
    process, deletes every namespace and releases the lock; it runs on exceptions, Ctrl-C and
    SIGTERM (turned into :class:`Terminated` while the testbed is open).
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        system: System,
        run_id: str | None = None,
        *,
        subnet: str = "10.77.0.0/24",
        state_dir: Path = STATE_DIR,
        lock_timeout: float = 0.0,
        procs: ProcOps | None = None,
        stop_timeout: float = 3.0,
    ) -> None:
        self.system = system
        self.run_id = run_id or new_run_id()
        if not _RUN_ID_RE.match(self.run_id):
            raise ValueError(f"run id {self.run_id!r}: use 1-8 characters [a-z0-9]")
        self.subnet = ipaddress.IPv4Network(subnet)
        self.state_dir = state_dir
        self.lock_timeout = lock_timeout
        self.procs: ProcOps = procs or RealProcOps()
        self.stop_timeout = stop_timeout
        self.bridge_netns = f"{NETNS_PREFIX}{self.run_id}-bridge"
        self.pods: dict[str, Pod] = {}
        self.meshed: dict[str, Interception] = {}
        self.reaped = ReapReport()
        self._lock = RunLock(state_dir)
        self._registry: Registry | None = None
        self._spawned: list[Process] = []
        self._hosts = self.subnet.hosts()
        next(self._hosts)  # .1 is left for the bridge side, should anyone need it
        self._old_sigterm: Any = None
        self._open = False

    # --- lifecycle ---------------------------------------------------------------------------

    def open(self) -> Testbed:
        if self._open:
            return self
        self._lock.acquire(self.lock_timeout)
        self._open = True
        try:
            self._install_sigterm()
            self.reaped = reap(self.system, self.procs, self.state_dir, timeout=self.stop_timeout)
            me = os.getpid()
            self._registry = Registry(
                self.state_dir, RunState(self.run_id, me, self.procs.start_time(me))
            )
            self._registry.save()
            self.add_netns(self.bridge_netns)
            ipn = ["ip", "-n", self.bridge_netns]
            self.system.run(ipn + ["link", "add", BRIDGE, "type", "bridge"])
            self.system.run(ipn + ["link", "set", BRIDGE, "up"])
        except BaseException:
            self.close(raise_errors=False)
            raise
        return self

    def __enter__(self) -> Testbed:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.close(raise_errors=exc is None)

    def close(self, *, raise_errors: bool = True) -> None:
        """Stop processes (newest first), delete namespaces, drop the state file and lock."""
        if not self._open:
            return
        errors: list[str] = []
        # a second Ctrl-C/SIGTERM must not cut teardown short; it is delivered afterwards
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for p in reversed(self._spawned):
                try:
                    p.stop(self.stop_timeout)
                except Exception as e:  # keep tearing down
                    errors.append(f"stop PID {p.pid}: {e}")
            if self._registry is not None:
                st = self._registry.state
                # processes adopted or left by helpers, checked by start time
                for rec in reversed(st.processes):
                    if rec.start_time is not None:
                        try:
                            self.procs.terminate(rec.pid, rec.start_time, timeout=self.stop_timeout)
                        except Exception as e:
                            errors.append(f"terminate PID {rec.pid}: {e}")
                for ns in reversed(st.netns):
                    try:
                        delete_netns(self.system, self.procs, ns, self.stop_timeout)
                    except Exception as e:
                        errors.append(f"delete netns {ns}: {e}")
                for d in st.dirs:
                    shutil.rmtree(d, ignore_errors=True)
                self._registry.remove()
            self._spawned.clear()
            self.pods.clear()
            self.meshed.clear()
            self._lock.release()
            self._restore_sigterm()
            self._open = False
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if errors and raise_errors:
            raise CleanupError("; ".join(errors))

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread

        def on_term(signum: int, frame: types.FrameType | None) -> None:
            raise Terminated()

        self._old_sigterm = signal.signal(signal.SIGTERM, on_term)

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    # --- pods --------------------------------------------------------------------------------

    def _require_open(self) -> Registry:
        if not self._open or self._registry is None:
            raise RuntimeError("testbed is not open (use `with Testbed(...) as tb:`)")
        return self._registry

    def add_netns(self, name: str) -> None:
        """Create namespace ``name`` (removed on close, reaped after a crash)."""
        # recorded before it exists: a crash in between leaves a record, never an orphan
        self._require_open().add_netns(name)
        self.system.run(["ip", "netns", "add", name])

    def claim_address(self) -> str:
        """The next free address of the bridge's subnet."""
        try:
            return str(next(self._hosts))
        except StopIteration:
            raise RuntimeError(f"subnet {self.subnet} is full") from None

    def pod_netns(self, name: str) -> str:
        """The namespace of pod (or node) ``name``, after checking the name is usable."""
        self._require_open()
        if not _NAME_RE.match(name) or name == "bridge":
            raise ValueError(f"pod name {name!r}: use 1-20 characters [a-z0-9-], not 'bridge'")
        if name in self.pods:
            raise ValueError(f"pod {name!r} exists")
        return f"{NETNS_PREFIX}{self.run_id}-{name}"

    def add_pod(self, name: str) -> Pod:
        """Create pod ``name``: a netns with ``eth0`` on the bridge and ``lo`` up."""
        netns = self.pod_netns(name)
        ip = self.claim_address()
        veth = f"veth{len(self.pods) + 1}"  # lives in the bridge netns: no global clash
        self.add_netns(netns)
        run = self.system.run
        # no IPv6: no router solicitations / DAD chatter on the bridge while we measure
        run(
            [
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
            place=Placement(netns=netns),
        )
        run(
            [
                "ip",
                "-n",
                self.bridge_netns,
                "link",
                "add",
                veth,
                "type",
                "veth",
                "peer",
                "name",
                POD_IF,
                "netns",
                netns,
            ]
        )
        run(["ip", "-n", self.bridge_netns, "link", "set", veth, "master", BRIDGE, "up"])
        run(["ip", "-n", netns, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", POD_IF])
        run(["ip", "-n", netns, "link", "set", POD_IF, "up"])
        run(["ip", "-n", netns, "link", "set", "lo", "up"])
        pod = Pod(name, netns, ip)
        self.pods[name] = pod
        return pod

    def mesh(
        self,
        pod: Pod,
        *,
        inbound_port: int = 15006,
        outbound_port: int = 15001,
        proxy_uid: int = 1337,
        proxy_gid: int | None = None,
        exclude_inbound_ports: Sequence[int] = (15000, 15090),
        exclude_outbound_ports: Sequence[int] = (),
    ) -> Interception:
        """Install Istio-style interception in ``pod`` (see :func:`istio_rules`)."""
        self._require_open()
        if pod.name in self.meshed:
            raise ValueError(f"pod {pod.name!r} is already meshed")
        c = Interception(
            inbound_port=inbound_port,
            outbound_port=outbound_port,
            proxy_uid=proxy_uid,
            proxy_gid=proxy_uid if proxy_gid is None else proxy_gid,
            exclude_inbound_ports=tuple(exclude_inbound_ports),
            exclude_outbound_ports=tuple(exclude_outbound_ports),
        )
        # rules live in the pod's netns and vanish with it
        for argv in istio_rules(c):
            self.system.run(argv, place=Placement(netns=pod.netns))
        self.meshed[pod.name] = c
        return c

    # --- processes ---------------------------------------------------------------------------

    def spawn(
        self,
        pod: Pod | None,
        argv: Sequence[str],
        *,
        place: Placement | None = None,
        stdout: IO[bytes] | int | None = subprocess.DEVNULL,
        stderr: IO[bytes] | int | None = subprocess.DEVNULL,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        """Start ``argv`` (inside ``pod`` if given, with ``place``'s CPUs/uid), record it, and
        stop it on close."""
        self._require_open()
        pl = place or Placement()
        if pod is not None:
            pl = dataclasses.replace(pl, netns=pod.netns)
        # tagged: a process started but not yet recorded when the run dies is still reaped
        tagged = {**(env or {}), RUN_ENV: self.run_id}
        p = self.system.spawn(argv, place=pl, stdout=stdout, stderr=stderr, env=tagged)
        self.adopt(p, pl.wrap(argv), netns=pl.netns)
        return p

    @property
    def registered(self) -> System:
        """A :class:`System` whose spawned processes belong to this testbed (recorded, tagged,
        stopped on close, reaped after a crash): give it to any tool that starts processes."""
        return _Registered(self)

    def pod_pids(self, pod: Pod) -> list[int]:
        """Every process in ``pod``'s namespace now."""
        return netns_pids(self.system, pod.netns)

    @property
    def processes(self) -> list[Process]:
        """Processes spawned or adopted so far, oldest first."""
        return list(self._spawned)

    def scratch_dirs(self) -> list[Path]:
        """Scratch directories made so far, oldest first (removed on close)."""
        reg = self._require_open()
        return [Path(d) for d in reg.state.dirs]

    def scratch_dir(self, prefix: str) -> Path:
        """A new temporary directory (configs, logs) that lives as long as the testbed: removed
        on close, and by the reaper after a crash."""
        reg = self._require_open()
        path = owned_tempdir(prefix.removeprefix("meshtax-").rstrip("-"), self.procs)
        reg.add_dir(path)
        return path

    def adopt(self, proc: Process, argv: Sequence[str] = (), *, netns: str | None = None) -> None:
        """Register a process started elsewhere so it is stopped on close and reaped after a
        crash."""
        reg = self._require_open()
        self._spawned.append(proc)
        reg.add_process(ProcRecord(proc.pid, self.procs.start_time(proc.pid), list(argv), netns))


class _Registered:
    """:attr:`Testbed.registered`: commands run as usual, processes spawn through the testbed."""

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb

    def run(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        check: bool = True,
        input: str | None = None,
        timeout: float | None = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        return self.tb.system.run(
            argv, place=place, check=check, input=input, timeout=timeout, env=env
        )

    def spawn(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        stdout: IO[bytes] | int | None = subprocess.DEVNULL,
        stderr: IO[bytes] | int | None = subprocess.DEVNULL,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        return self.tb.spawn(None, argv, place=place, stdout=stdout, stderr=stderr, env=env)
