"""Extended call graphs (ECG): services, their sidecars, and a DAG of invocations.

An :class:`ECG` is the readable, validated form of one call graph. :class:`EcgBatch` is the
columnar (NumPy) form of many graphs that the vectorized prediction core consumes; build it
with :func:`to_batch` or :class:`BatchBuilder`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from meshtax.errors import ModelError
from meshtax.model.sidecar import SidecarConfig

#: Published defaults (Zhu et al.): 100 B messages.
DEFAULT_MESSAGE_BYTES = 100.0
#: The paper's large-scale study rate: 30K requests/s.
DEFAULT_RATE_RPS = 30_000.0

EXTERNAL = ""  # caller name of an invocation made by a client outside the graph (no sidecar)

#: Application protocols an invocation can name (``EcgBatch.protocol`` codes are indices;
#: 0, "", is unknown or raw bytes). Only a sidecar that does not parse (tcp mode) prices them
#: differently, with the models its profile measured for that protocol on the wire.
PROTOCOLS: tuple[str, ...] = ("", "http", "grpc")


@dataclass(frozen=True)
class Service:
    """A service instance: its sidecar and the platform (profile name) it runs on."""

    name: str
    sidecar: SidecarConfig = SidecarConfig()
    platform: str | None = None  # profile name; None → the profile chosen for the prediction
    connections: int | None = None  # open connections of its sidecar, for memory


@dataclass(frozen=True)
class Invocation:
    """One RPC: caller → callee, sizes in bytes, rate in requests/s, times in µs without mesh."""

    id: str
    caller: str  # EXTERNAL for the graph's entry call
    callee: str
    request_bytes: float = DEFAULT_MESSAGE_BYTES
    response_bytes: float = DEFAULT_MESSAGE_BYTES
    rate: float = DEFAULT_RATE_RPS
    start_us: float = 0.0
    duration_us: float = 0.0
    parent: str | None = None
    protocol: str = ""  # application protocol on the wire, one of PROTOCOLS ("" unknown)
    new_connections: float = (
        0.0  # share of calls that open a new connection (0: pooled, 1: one per call)
    )


@dataclass(frozen=True)
class ECG:
    """A validated call graph; invocations are in topological order (parents first)."""

    name: str
    services: Mapping[str, Service]
    invocations: tuple[Invocation, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)


class ECGError(ModelError):
    """A call graph that cannot be used; lists every problem found, each with where it is."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n{lines}", file=source)


def validate(
    name: str,
    services: Mapping[str, Service],
    invocations: Sequence[Invocation],
    source: str = "<ecg>",
) -> ECG:
    """Check an ECG's semantics and return it with invocations in topological order.

    Reports together: duplicate ids, unknown services and parents, cycles, negative or
    non-finite sizes/rates/times, a caller that is not the parent's callee, and children that
    start before their parent starts or end after it ends.
    """
    problems: list[str] = []
    by_id: dict[str, int] = {}
    for i, inv in enumerate(invocations):
        where = f"invocations[{i}] (id {inv.id!r})"
        if inv.id in by_id:
            problems.append(f"{where}: duplicate id (also invocations[{by_id[inv.id]}])")
        else:
            by_id[inv.id] = i
        for role, svc in (("caller", inv.caller), ("callee", inv.callee)):
            if svc != EXTERNAL and svc not in services:
                problems.append(
                    f"{where}.{role}: unknown service {svc!r}; expected one of the names under 'services'"
                )
        if inv.callee == EXTERNAL:
            problems.append(f"{where}.callee: missing; expected a service name")
        for fname in ("request_bytes", "response_bytes", "rate", "duration_us"):
            v = getattr(inv, fname)
            if not np.isfinite(v) or v < 0:
                problems.append(f"{where}.{fname}: {v!r}; expected a finite number ≥ 0")
        if not np.isfinite(inv.start_us):
            problems.append(f"{where}.start_us: {inv.start_us!r}; expected a finite number")
        if not (np.isfinite(inv.new_connections) and 0.0 <= inv.new_connections <= 1.0):
            problems.append(
                f"{where}.new_connections: {inv.new_connections!r}; expected a share between 0 and 1"
            )
        if inv.protocol not in PROTOCOLS:
            problems.append(
                f"{where}.protocol: {inv.protocol!r}; expected one of {', '.join(p for p in PROTOCOLS if p)}"
            )
    # parents, cycles, containment
    for i, inv in enumerate(invocations):
        where = f"invocations[{i}] (id {inv.id!r})"
        if inv.parent is None:
            continue
        if inv.parent not in by_id:
            problems.append(f"{where}.parent: unknown invocation id {inv.parent!r}")
            continue
        p = invocations[by_id[inv.parent]]
        if inv.caller != p.callee:
            problems.append(
                f"{where}.caller: {inv.caller!r}, but the parent {p.id!r} is served by "
                f"{p.callee!r}; a child call is made by its parent's callee"
            )
        eps = 1e-6 * max(1.0, abs(p.start_us + p.duration_us))
        if inv.start_us < p.start_us - eps:
            problems.append(
                f"{where}.start_us: {inv.start_us:g} µs is before its parent {p.id!r} starts ({p.start_us:g} µs)"
            )
        if inv.start_us + inv.duration_us > p.start_us + p.duration_us + eps:
            problems.append(
                f"{where}.duration_us: ends at {inv.start_us + inv.duration_us:g} µs, after its parent {p.id!r} ends "
                f"({p.start_us + p.duration_us:g} µs); a call must finish before its caller answers"
            )
    order: list[int] = []
    if not problems:
        order, cyc = _topological(invocations, by_id)
        for c in cyc[:20]:
            shown = c if len(c) <= 12 else [*c[:10], f"… {len(c) - 11} more …", c[-1]]
            problems.append(f"invocations: cycle through parent links: {' → '.join(shown)}")
        if len(cyc) > 20:
            problems.append(f"invocations: … and {len(cyc) - 20} more cycles")
    if problems:
        raise ECGError(source, problems)
    return ECG(name, dict(services), tuple(invocations[i] for i in order))


def _topological(
    invs: Sequence[Invocation], by_id: Mapping[str, int]
) -> tuple[list[int], list[list[str]]]:
    children: dict[int, list[int]] = {}
    roots = []
    for i, inv in enumerate(invs):
        if inv.parent is None:
            roots.append(i)
        else:
            children.setdefault(by_id[inv.parent], []).append(i)
    order: list[int] = []
    stack = list(reversed(roots))
    seen = set()
    while stack:
        i = stack.pop()
        seen.add(i)
        order.append(i)
        stack.extend(reversed(children.get(i, [])))
    cycles: list[list[str]] = []
    rest = [i for i in range(len(invs)) if i not in seen]
    done: set[int] = set()
    for i in rest:
        if i in done:
            continue
        path: dict[int, int] = {}  # row → position on the walk (a set and an order in one)
        j = i
        while j not in done and j not in path:
            path[j] = len(path)
            j = by_id[invs[j].parent]  # type: ignore[index]
        if j in path:
            loop = list(path)[path[j] :]
            cycles.append([invs[k].id for k in loop] + [invs[j].id])
        done.update(path)
    return order, cycles


# ---- columnar form ------------------------------------------------------------------------


@dataclass(frozen=True)
class SidecarSpec:
    """A distinct sidecar in a batch: its configuration and the profile (platform) it uses."""

    config: SidecarConfig
    platform: str | None = None


IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class EcgBatch:
    """Many call graphs as flat arrays (one row per invocation).

    Graph ``g`` owns rows ``graph_ptr[g]:graph_ptr[g+1]``. ``parent`` holds global row
    indices (-1 for roots) and every parent row precedes its children. ``caller_spec`` and
    ``callee_spec`` index :attr:`specs` (-1: no sidecar, e.g. an external client).
    ``caller``/``callee`` index :attr:`services` (-1: external) for per-service breakdowns.
    """

    graph_ptr: IntArray
    parent: IntArray
    caller: IntArray
    callee: IntArray
    caller_spec: IntArray
    callee_spec: IntArray
    request_bytes: FloatArray
    response_bytes: FloatArray
    rate: FloatArray
    start_us: FloatArray
    duration_us: FloatArray
    services: tuple[str, ...]
    specs: tuple[SidecarSpec, ...]
    graph_names: tuple[str, ...]
    row_ids: tuple[str, ...] = ()  # invocation ids, when the graphs came with them
    protocol: IntArray | None = None  # index into PROTOCOLS per row; None: all unknown
    new_connections: FloatArray | None = (
        None  # share of calls opening a connection per row; None: all 0
    )

    @property
    def n_graphs(self) -> int:
        return int(self.graph_ptr.size - 1)

    @property
    def n_invocations(self) -> int:
        return int(self.parent.size)

    def graph_of(self) -> IntArray:
        """Graph index of every row."""
        return np.repeat(np.arange(self.n_graphs, dtype=np.int64), np.diff(self.graph_ptr))


class BatchBuilder:
    """Accumulates graphs row by row, then freezes them into an :class:`EcgBatch`."""

    def __init__(self) -> None:
        self._services: dict[str, int] = {}
        self._specs: dict[SidecarSpec, int] = {}
        self._service_spec: dict[int, int] = {}
        self._cols: dict[str, list[Any]] = {
            k: [] for k in ("parent", "caller", "callee", "req", "resp", "rate", "start", "dur")
        }
        self._ptr = [0]
        self._names: list[str] = []
        self._ids: list[str] = []
        self._proto: list[int] = []
        self._conn: list[float] = []

    def service(self, name: str, sidecar: SidecarConfig, platform: str | None = None) -> int:
        """Index of a service (registered on first use; its sidecar must not change)."""
        idx = self._services.get(name)
        spec = -1
        if sidecar.meshed:
            s = SidecarSpec(sidecar, platform)
            spec = self._specs.setdefault(s, len(self._specs))
        if idx is None:
            idx = self._services[name] = len(self._services)
            self._service_spec[idx] = spec
        elif self._service_spec[idx] != spec:
            raise ValueError(f"service {name!r} appears with two different sidecar configurations")
        return idx

    def add_graph(
        self,
        name: str,
        rows: Iterable[tuple[int, int, int, float, float, float, float, float]],
        protocols: Sequence[int] | None = None,
        new_connections: Sequence[float] | None = None,
    ) -> None:
        """Add one graph. Rows: (local parent or -1, caller svc or -1, callee svc, req, resp, rate, start, dur),
        parents before children; ``protocols``: a PROTOCOLS index per row (None: unknown);
        ``new_connections``: the share of calls opening a connection per row (None: 0)."""
        base = self._ptr[-1]
        n = 0
        c = self._cols
        for p, caller, callee, req, resp, rate, start, dur in rows:
            if p >= n:
                raise ValueError(
                    f"graph {name!r}: row {n} names parent {p}, which does not precede it"
                )
            c["parent"].append(-1 if p < 0 else base + p)
            c["caller"].append(caller)
            c["callee"].append(callee)
            c["req"].append(req)
            c["resp"].append(resp)
            c["rate"].append(rate)
            c["start"].append(start)
            c["dur"].append(dur)
            n += 1
        for what, col in (("protocols", protocols), ("new_connections", new_connections)):
            if col is not None and len(col) != n:
                raise ValueError(f"graph {name!r}: {len(col)} {what} for {n} rows")
        self._proto.extend(protocols if protocols is not None else [0] * n)
        self._conn.extend(new_connections if new_connections is not None else [0.0] * n)
        self._ptr.append(base + n)
        self._names.append(name)

    def add_ecg(self, ecg: ECG) -> None:
        idx = {inv.id: k for k, inv in enumerate(ecg.invocations)}
        self._ids.extend(inv.id for inv in ecg.invocations)

        def svc(name: str) -> int:
            if name == EXTERNAL:
                return -1
            s = ecg.services[name]
            return self.service(name, s.sidecar, s.platform)

        self.add_graph(
            ecg.name,
            (
                (
                    -1 if inv.parent is None else idx[inv.parent],
                    svc(inv.caller),
                    svc(inv.callee),
                    inv.request_bytes,
                    inv.response_bytes,
                    inv.rate,
                    inv.start_us,
                    inv.duration_us,
                )
                for inv in ecg.invocations
            ),
            [PROTOCOLS.index(inv.protocol) for inv in ecg.invocations],
            [inv.new_connections for inv in ecg.invocations],
        )

    def build(self) -> EcgBatch:
        c = self._cols
        caller = np.asarray(c["caller"], dtype=np.int64)
        callee = np.asarray(c["callee"], dtype=np.int64)
        spec_of = np.full(len(self._services) + 1, -1, dtype=np.int64)  # last slot: external (-1)
        for svc, spec in self._service_spec.items():
            spec_of[svc] = spec
        return EcgBatch(
            graph_ptr=np.asarray(self._ptr, dtype=np.int64),
            parent=np.asarray(c["parent"], dtype=np.int64),
            caller=caller,
            callee=callee,
            caller_spec=spec_of[caller],
            callee_spec=spec_of[callee],
            request_bytes=np.asarray(c["req"], dtype=np.float64),
            response_bytes=np.asarray(c["resp"], dtype=np.float64),
            rate=np.asarray(c["rate"], dtype=np.float64),
            start_us=np.asarray(c["start"], dtype=np.float64),
            duration_us=np.asarray(c["dur"], dtype=np.float64),
            services=tuple(self._services),
            specs=tuple(self._specs),
            graph_names=tuple(self._names),
            row_ids=tuple(self._ids) if len(self._ids) == self._ptr[-1] else (),
            protocol=np.asarray(self._proto, dtype=np.int64) if any(self._proto) else None,
            new_connections=np.asarray(self._conn, dtype=np.float64) if any(self._conn) else None,
        )


def to_batch(ecgs: Iterable[ECG]) -> EcgBatch:
    b = BatchBuilder()
    for e in ecgs:
        b.add_ecg(e)
    return b.build()
