"""Readings → per-message components (pure).

Units: µs per *crossing* — one message through one sidecar in one direction. A closed-loop
request and its response through the one sidecar of the testbed are two crossings, so
per-request totals are halved (:data:`CROSSINGS_PER_REQUEST`).

Latency: overhead = the sidecar's on-path time + how the app's own path changes.
----------------------------------------------------------------------------------
With the sidecar, the app talks to its sidecar over loopback; without it, the app talks to the
client over the pod's veth. So the mesh both *adds* the sidecar's work and *changes* the app's
(its write toward the client becomes a loopback write toward the sidecar; it is woken by the
sidecar on its own CPU instead of by the client from another CPU). It also changes the client's: the
client's request now goes through the server pod's interception (PREROUTING REDIRECT to the
sidecar), whose netfilter work runs in the *client's* send path — on loopback and over veth the
receiver's RX path runs as softirq inside the sender's write, on the sender's CPU. The probe
therefore watches the sidecar, the app *and* the client (every process of the client pod,
followed by namespace), in windows that alternate meshed and direct runs (:class:`Window`),
and :func:`mesh_breakdown` computes, per crossing:

* **Read** = sidecar read-family wall time + Δapp read (meshed − direct) + Δclient read.
* **Write** = sidecar write-family wall time + Δapp write − IPC. Without the app term the
  sidecar's write toward the client (veth → bridge → veth, with the client's RX path and a
  cross-CPU wake-up inside it) would be counted as overhead although the direct path has the
  very same write, done by the app; Δapp write removes it and adds the app's loopback write.
  On loopback the receiver's RX path runs inside the sender's write (softirq on
  ``local_bh_enable``), so IPC is inside the writes and is subtracted (DESIGN.md: "Write …
  minus IPC").
* **IPC** = loopback delivery (``net_dev_queue`` → ``netif_receive_skb`` on ``lo`` of the
  pod), meshed − direct, + Δclient write. Every ``lo`` packet counts — both senders' data and
  any separate ACK/window update — because, with the app term above, both senders' writes are
  counted too; the direct path has no ``lo`` traffic. Δclient write is the interception's
  kernel delivery of the message to the sidecar instead of the app (REDIRECT's NAT and
  conntrack work, delivery to the sidecar's socket, its wake-up): the client's write carries
  the very same bytes in both windows, so what changes is only how the kernel delivers them,
  and "kernel delivery of a message between an app and its sidecar" (DESIGN.md) is what
  interception is for — without a sidecar there is no redirect. It is not Write (the
  sidecar's own syscalls) and not subtracted from Write (it is not inside the sidecar's or the
  app's writes).
* **IPC socket to socket** (the app↔sidecar legs on Unix sockets, ``--ipc uds``, or on
  loopback TCP redirected by sockmap/sk_msg, ``--ipc sockmap``): no device, so nothing on
  ``lo``; the probe times, per thread, the delivery inside each send — ``sk_data_ready`` of
  the peer (data queued, peer woken) to the end of that send (``sock_send_length``) — for
  the sidecar's and the app's sends (meshed − direct app), added to IPC and subtracted from
  Write as loopback delivery is. The two IPC definitions time different stretches of the
  send (loopback: device queue → receive, the TCP receive and wake-up staying in Write;
  socket to socket: the wake-up to the end of the send), so IPC alone is not comparable
  across the two; IPC + Write is (each is the whole send). On a kernel without those
  tracepoints (before 6.6) that delivery stays in Write
  (:attr:`~meshtax.testbed.probe_reading.IpcStat.sock_method` says ``unavailable``).
* **Zero-copy completions** (``recvmsg(MSG_ERRQUEUE)``, ``--write zerocopy``) are not Read:
  they are the zero-copy send's cost, counted in **Write**.
* **Notification** = sidecar wake-up→epoll-return + Δapp notification + Δclient
  notification (the client's wake-up from its longer wait takes longer — on this VM
  ≈ 3–5 µs per crossing in tcp mode: its CPU idles deeper; on the path, so counted). This includes the
  run-queue wait for the CPU the sidecar shares with the app (real on-path time in this
  placement) — except the part of each wait spent behind the sidecar's own counted work
  (its reads, writes, user-space work and other syscalls on that CPU between the wake-up and
  the epoll return; the probe's ``notify_behind_ns``): that time is the sidecar's Read, Write
  and Other already, and counting it again in the woken app's Notification counted it twice.
  It matters where a proxy delivers a large message in several writes: HAProxy and nginx
  move 64 KB in 16 KB buffers, the app woken by the first write waits for CPU behind the
  next three, and tcp-mode profiles over-counted +22 % (64 KB: +34 %, BENCHMARKS.md issue
  #18) where Envoy, writing it whole, did not. The sidecar's epoll_wait entry and the
  context switch are in no other component and stay in the wait. The sidecar's first
  wake-up of a request (by the client, from the other CPU) replaces the app's wake-up of the
  direct path; Δapp notification removes that.
* **user** (→ Other in TCP, Other + Parsing in HTTP/gRPC, :func:`assemble`) = sidecar on-CPU
  time outside syscalls + Δapp user; **kernel_other** = wall time of the sidecar's remaining
  syscalls (not read/write/epoll). Only sidecar threads that read or wrote count
  (:func:`traffic_threads`); the app's threads are summed whole (its runtime threads behave
  the same in both windows, so they cancel in Δ) and its other syscalls are not used (Go's
  futex sleeps are not on any path). The client's user time and other syscalls are not used
  either: its request loop is the same in both windows; what grows (+0.4–3 µs per crossing in
  tcp/http, +9–17 µs in gRPC) is its Go runtime spinning and parking while it waits longer,
  which is not on the path as a whole, and it sleeps in futex between requests.
* **Δclient** terms are *per call*: (meshed − direct mean time of one read / write /
  notification) × the calls per crossing of the direct path. The client's request needs the
  same calls with or without the mesh; the mesh changes what each costs. In gRPC mode Envoy
  sends each response in two writes, so the meshed client reads and wakes twice per request
  (once in direct): a total-time Δ counted that second wake-up (+5–8 µs per crossing, largely
  off the path: closure went to +15…+19 %); the per-call Δ does not. In tcp and http the
  call counts match and both give the same.

Known residuals (measured on the 2-CPU dev VM; numbers in BENCHMARKS.md, issue #3 section):

* the client's user-time growth (above) is left out; in tcp/http what stays unattributed after
  the client terms is −2…+10 µs per crossing, scattered around zero across sizes and runs
  (the window noise of the probed overhead itself is ±5–10 µs);
* app work the mesh causes *after* the response has left (gRPC: Envoy's HTTP/2 control frames
  wake the app a second time per request) is counted in Δapp though it is off the path
  (over-count, gRPC: components exceed the probed overhead by ≈ 10–20 µs per crossing);
* the app's work after writing its response (Go runtime parking) is on the path with the
  sidecar only; the sidecar's Notification (wake-up → epoll return) contains the run-queue
  wait behind it, which is where this definition counts it.

Wake-up stalls. The probe also keeps a per-event histogram of notification latency
(:attr:`~meshtax.testbed.probes.ThreadReading.notify_hist`). On the shared 2-vCPU dev VM a
handful of wake-ups per window took 0.2–5 ms (10–60 % of a window's notification time,
most in gRPC's direct windows) and decided how Notification came out; BENCHMARKS.md (issue
#3) has the numbers. Dropping them (``notify_trim``, or a cut at 131 µs) from Notification
alone made closure worse (they are in the measured overhead too), so the default keeps the
plain mean. Probe windows at ``SCHED_FIFO`` (:func:`~meshtax.testbed.probes.realtime`,
``Plan.probe_rt_priority``) removed the stalls but changed how sidecar and app share their
CPU (closure +19 % in gRPC) and agreed worse; off by default.

The sidecar never got preempted by the app on this machine (the woken app waits until the
sidecar blocks), so the sidecar's intervals do not hide the app's work.

With ``direct=None`` (the app not probed), the sidecar's numbers are used alone (Write minus
all IPC) — the old definition, which over-counts the veth write.

The probe perturbs what it measures (a few hundred ns per traced event): closure is checked
against the overhead measured *in the same probe windows* (probed meshed − probed direct), and
the perturbation (probed − un-probed overhead) is recorded next to it.

CPU (from perf ``cpu-clock`` buckets of the sidecar process during a fixed-rate run): the
buckets map one to one (perf already charges the loopback RX path to ``ipc``, not ``write``);
``kernel_other`` is kernel time no symbol rule claims. The probe's own bucket is left out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace

from meshtax.model.components import IPC, NOTIFICATION, OTHER, PARSING, READ, WRITE, Component
from meshtax.model.sidecar import Mode
from meshtax.testbed.probe_reading import EMPTY_THREAD, OpStat, ProbeReading, ThreadReading

__all__ = [
    "CROSSINGS_PER_REQUEST",
    "Breakdown",
    "Window",
    "assemble",
    "chain_breakdown",
    "cpu_breakdown",
    "latency_breakdown",
    "mesh_breakdown",
    "notify_ns",
    "per_crossing",
    "traffic_threads",
]

CROSSINGS_PER_REQUEST = 2


def per_crossing(per_request: float) -> float:
    """A per-request quantity (request + response through one sidecar) per crossing."""
    return per_request / CROSSINGS_PER_REQUEST


@dataclass(frozen=True)
class Breakdown:
    """Raw per-crossing times (µs) before Other/Parsing are separated."""

    read: float = 0.0
    write: float = 0.0
    ipc: float = 0.0
    notification: float = 0.0
    user: float = 0.0
    kernel_other: float = 0.0

    @property
    def sidecar_work(self) -> float:
        """What Other + Parsing share: user time plus the uncategorised kernel time."""
        return self.user + self.kernel_other

    def total(self) -> float:
        return float(sum(getattr(self, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _crossings(requests: int) -> int:
    if requests <= 0:
        raise ValueError(f"need a positive request count, got {requests}")
    return CROSSINGS_PER_REQUEST * requests


def traffic_threads(reading: ProbeReading) -> ThreadReading:
    """Sum of the threads that read or wrote in the window (Envoy's workers).

    The others (main thread, flush and stats threads) sleep in futex/poll calls the whole
    window; their syscall wall time is not on any message's path.
    """
    busy = [t for t in reading.threads if t.read.count or t.write.count]
    if not busy:
        return reading.total
    out = busy[0]
    for t in busy[1:]:
        out = out + t
    return out


def _threads_of(
    reading: ProbeReading, tgid: int | Collection[int] | None, busy_only: bool
) -> ThreadReading:
    tgids = {tgid} if isinstance(tgid, int) else None if tgid is None else set(tgid)
    ts = [t for t in reading.threads if tgids is None or t.tgid in tgids]
    if busy_only:
        ts = [t for t in ts if t.read.count or t.write.count] or ts
    out = EMPTY_THREAD
    for t in ts:
        out = out + t
    return out


@dataclass(frozen=True)
class Window:
    """Probe windows reduced to what :func:`mesh_breakdown` needs (totals in ns).

    ``sidecar``: the sidecar's threads that read or wrote; ``app``: all threads of the app
    (empty if it was not probed); ``client``: all followed threads (the load generator's pod;
    empty if it was not followed); ``ipc_*``: loopback skbs of the pod; ``requests``: requests
    the load generator completed in the window. Windows of one kind add up (``+``).
    """

    requests: int
    sidecar: ThreadReading = EMPTY_THREAD
    app: ThreadReading = EMPTY_THREAD
    ipc_ns: int = 0
    ipc_packets: int = 0
    ipc_bytes: int = 0
    client: ThreadReading = EMPTY_THREAD

    @classmethod
    def of(
        cls,
        reading: ProbeReading,
        requests: int,
        *,
        sidecar_tgid: int | None,
        app_tgid: int | Collection[int] | None = None,
    ) -> Window:
        """Split a reading into sidecar, app (``app_tgid=None``: no app threads; several: the
        app and the other proxies on both paths, whose change counts alike) and client (the
        followed threads)."""
        mine = [t for t in reading.threads if not t.followed]
        own = replace(reading, threads=tuple(mine))
        if sidecar_tgid is None:
            side = traffic_threads(own)
        else:
            side = _threads_of(own, sidecar_tgid, busy_only=True)
        app = EMPTY_THREAD if app_tgid is None else _threads_of(own, app_tgid, busy_only=False)
        client = EMPTY_THREAD
        for t in reading.threads:
            if t.followed:
                client = client + t
        return cls(
            requests, side, app, reading.ipc.ns, reading.ipc.count, reading.ipc.bytes, client
        )

    def __add__(self, other: Window) -> Window:
        return Window(
            self.requests + other.requests,
            self.sidecar + other.sidecar,
            self.app + other.app,
            self.ipc_ns + other.ipc_ns,
            self.ipc_packets + other.ipc_packets,
            self.ipc_bytes + other.ipc_bytes,
            self.client + other.client,
        )


def _other_syscalls_ns(t: ThreadReading) -> int:
    # syscalls outside the three families and the error queue (timers, setsockopt …):
    # sidecar work too; clamp the small negative a window edge can give (a call entered
    # before attach)
    return max(0, t.sys_ns - t.read.ns - t.write.ns - t.epoll.ns - t.errqueue.ns)


def notify_ns(t: ThreadReading, trim: float = 0.0) -> float:
    """Notification time of ``t`` on the path (ns): its wake-up → epoll return sum less the
    part it waited behind the watched proxy's counted work on its CPU
    (:attr:`~meshtax.testbed.probe_reading.ThreadReading.notify_behind_ns`: that work is the
    proxy's Read, Write and Other already); with ``trim`` > 0 and a per-event histogram, the
    wake-ups times their mean after dropping the slowest ``trim`` share, less the same."""
    if trim <= 0.0 or t.notify_hist.count <= 0:
        total = float(t.notify.ns)
    else:
        total = t.notify_hist.trimmed_mean_ns(trim) * t.notify.count
    return max(0.0, total - t.notify_behind_ns)


def _notify_op(t: ThreadReading, trim: float) -> OpStat:
    return OpStat(t.notify.count, round(notify_ns(t, trim)), t.notify.bytes, t.notify.errors)


def mesh_breakdown(meshed: Window, direct: Window | None, *, notify_trim: float = 0.0) -> Breakdown:
    """Per-crossing latency components (µs) from meshed windows and, if the app was probed,
    the direct windows that pair with them (see the module docstring for the definitions).

    Write is kept signed (a negative value means the app-side change outweighed the sidecar's
    writes: a measurement to look at, not to hide). ``notify_trim``: every notification term
    (sidecar, app, client, meshed and direct alike) uses the per-event mean without the
    slowest ``notify_trim`` share of wake-ups (:func:`notify_ns`); 0 is the plain mean.
    """
    n = _crossings(meshed.requests)
    s = meshed.sidecar

    def us(ns: float) -> float:
        return ns * 1e-3 / n

    read, write = us(s.read.ns), us(s.write.ns + s.errqueue.ns)
    notify, user = us(notify_ns(s, notify_trim)), us(s.user_ns)
    # inside the writes of sidecar and app: loopback delivery, and socket-to-socket delivery
    # of the sidecar's sends (the app's below, as a change)
    lo = us(meshed.ipc_ns + s.sock_ipc.ns)
    intercept = 0.0  # inside the client's writes, not theirs
    if direct is not None:
        nd = _crossings(direct.requests)

        def delta(m_ns: float, d_ns: float) -> float:
            return m_ns * 1e-3 / n - d_ns * 1e-3 / nd

        a, d = meshed.app, direct.app
        read += delta(a.read.ns, d.read.ns)
        write += delta(a.write.ns + a.errqueue.ns, d.write.ns + d.errqueue.ns)
        lo += delta(a.sock_ipc.ns, d.sock_ipc.ns)
        notify += delta(notify_ns(a, notify_trim), notify_ns(d, notify_trim))
        user += delta(a.user_ns, d.user_ns)
        lo -= direct.ipc_ns * 1e-3 / nd
        c, e = meshed.client, direct.client

        def per_call(m: OpStat, d: OpStat) -> float:
            # the change of what each call costs, times the calls the direct path needs
            return (m.mean_ns - d.mean_ns) * d.count * 1e-3 / nd

        intercept = per_call(c.write, e.write)
        read += per_call(c.read, e.read)
        notify += per_call(_notify_op(c, notify_trim), _notify_op(e, notify_trim))
    return Breakdown(
        read=read,
        write=write - lo,
        ipc=lo + intercept,
        notification=notify,
        user=user,
        kernel_other=us(_other_syscalls_ns(s)),
    )


def chain_breakdown(meshed: Window, direct: Window) -> Breakdown:
    """Per-crossing latency components when the proxies on the path share one CPU with the
    app (the node bed: node proxies, a waypoint and the app all on the sidecars' CPU): each
    one's wait for that CPU is another's work on it, so the wall times :func:`mesh_breakdown`
    adds would count that work twice (a waypoint profile came out +24…+58 % over its measured
    overhead that way, BENCHMARKS.md issue #18). On-CPU time adds up instead: the watched
    proxy's user and kernel CPU plus the change of the app's and the other proxies', plus the
    client's per-call terms (on the other CPU, as in :func:`mesh_breakdown`). Read and Write
    are the watched proxy's read/write syscalls and the change of the others' (as there),
    IPC is as there; Notification is the client's change alone; ``kernel_other`` is the rest
    of the kernel CPU (signed: a syscall preempted by a woken process counts its wall time
    in Read/Write, the CPU total takes it back)."""
    base = mesh_breakdown(meshed, direct)
    n, nd = _crossings(meshed.requests), _crossings(direct.requests)
    s, a, d = meshed.sidecar, meshed.app, direct.app

    def delta(m_ns: float, d_ns: float) -> float:
        return m_ns * 1e-3 / n - d_ns * 1e-3 / nd

    def us(ns: float) -> float:
        return ns * 1e-3 / n

    c, e = meshed.client, direct.client

    def per_call(m: OpStat, d_: OpStat) -> float:
        return (m.mean_ns - d_.mean_ns) * d_.count * 1e-3 / nd

    in_rw = us(s.read.ns + s.write.ns + s.errqueue.ns) + delta(
        a.read.ns + a.write.ns + a.errqueue.ns, d.read.ns + d.write.ns + d.errqueue.ns
    )
    kernel = us(s.sys_cpu_ns) + delta(a.sys_cpu_ns, d.sys_cpu_ns)
    return replace(
        base,
        notification=per_call(c.notify, e.notify),
        user=us(s.user_ns) + delta(a.user_ns, d.user_ns),
        kernel_other=kernel - in_rw,
    )


def latency_breakdown(reading: ProbeReading, requests: int) -> Breakdown:
    """Per-crossing on-path times (µs) of the sidecar alone, from a probe window that saw
    ``requests`` requests (Write clamped at 0 after subtracting all IPC)."""
    n = _crossings(requests)
    t = traffic_threads(reading)
    us = 1e-3 / n  # ns total → µs per crossing
    ipc = (reading.ipc.ns + t.sock_ipc.ns) * us
    rest = _other_syscalls_ns(t)
    return Breakdown(
        read=t.read.ns * us,
        write=max(0.0, (t.write.ns + t.errqueue.ns) * us - ipc),
        ipc=ipc,
        notification=t.notify.ns * us,
        user=t.user_ns * us,
        kernel_other=rest * us,
    )


def cpu_breakdown(buckets_ns: Mapping[str, int], requests: int) -> Breakdown:
    """Per-crossing CPU-µs from perf buckets (keys are :class:`~meshtax.testbed.perf.Bucket`
    values: user, read, write, notification, ipc, kernel_other; ``probe`` is ignored)."""
    n = _crossings(requests)
    us = 1e-3 / n

    return Breakdown(**{f.name: float(buckets_ns.get(f.name, 0)) * us for f in fields(Breakdown)})


def steady_breakdown(
    short: Breakdown, short_requests: int, long: Breakdown, long_requests: int
) -> Breakdown:
    """Per-crossing CPU-µs of the requests a longer run adds over a shorter one at the same
    rate: ``(long·n_long − short·n_short) / (n_long − n_short)``, so what every run costs once
    (the client's new connection and its set-up in the sidecar, the sampler's start) cancels.
    At 100 requests/s a 0.8 s run has 80 requests to share that cost; a quick profile's gRPC
    run there came out at 4× its cost at 300/s (BENCHMARKS.md, issue #14)."""
    if long_requests <= short_requests:
        raise ValueError(f"the longer run must add requests: {short_requests} → {long_requests}")
    nl, ns = _crossings(long_requests), _crossings(short_requests)
    return Breakdown(
        **{
            f.name: (getattr(long, f.name) * nl - getattr(short, f.name) * ns) / (nl - ns)
            for f in fields(Breakdown)
        }
    )


def assemble(mode: Mode, bd: Breakdown, tcp_baseline: Breakdown | None) -> dict[Component, float]:
    """Components of one mode at one size.

    TCP: Other = sidecar work, Parsing = 0. HTTP/gRPC with a TCP baseline at the same size:
    Other = the baseline's sidecar work, Parsing = this mode's minus it (kept signed: a
    negative value is noise the caller should see, not hide). Without a baseline everything
    is Other and Parsing is 0.
    """
    out: dict[Component, float] = {
        IPC: bd.ipc,
        READ: bd.read,
        WRITE: bd.write,
        NOTIFICATION: bd.notification,
    }
    if mode is Mode.TCP or tcp_baseline is None:
        out[PARSING] = 0.0
        out[OTHER] = bd.sidecar_work
    else:
        out[OTHER] = tcp_baseline.sidecar_work
        out[PARSING] = bd.sidecar_work - tcp_baseline.sidecar_work
    return out
