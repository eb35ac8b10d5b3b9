"""Profiles: per-platform, per-mode cost models of every component, with provenance."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from meshtax.model.capacity import Capacity, LatencySketch, sketches_from_list
from meshtax.model.components import Component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.microarch import Microarch
from meshtax.model.sidecar import Mode
from meshtax.model.speed import Speed
from meshtax.model.transfer import Transfer

#: Version of the profile document format (bump with a dated note when it changes).
#: 1 — 2026-11-22: first format. Later the same day, optional per-mode ``memory``,
#:     ``memory_mtls`` and ``tls_handshake`` (absent or null in older documents; readers of
#:     the first shape ignore them). Optional per-mode ``carried`` (models of the mode
#:     measured with an application protocol on the wire; absent in older documents).
#:     Optional per-mode ``tls_version``, ``tls_by_version`` and ``per_connection`` (issue #4:
#:     which TLS version ``tls``/``tls_handshake`` are for, the models of every measured
#:     version, and per-connection costs of filters that run once per connection; written
#:     only when set, absent in older documents). Optional top-level ``colocation`` (issue #6:
#:     how much the CPU's message rate warms one of many co-located sidecars; absent in older
#:     documents, which price every message at the shared CPU's rate, ``alpha`` = 1), per mode.
#: 2 — 2026-11-23: optional top-level ``speed`` (the reference workload's speed while the
#:     profile was measured, :mod:`meshtax.model.speed`) and ``interference`` (what else ran in
#:     its probe windows: shares of other work, steal, run-queue wait; windows refused), and
#:     ``status`` (``closed`` | ``unclosed``: a mode whose components did not add up to the
#:     measured overhead after the profiler's retries). Format-1 documents load unchanged.
#:     ``colocation`` (the exponent ``meshtax calibrate`` fitted on chains) is no longer used
#:     or written: shared CPUs are priced from the profile's own rate models (issue #14);
#:     documents that carry it still load. Optional platform ``variant`` (issue #17: the
#:     sidecar's IPC/write variant, e.g. ``ipc=uds``; written only when set, so older
#:     platforms keep their keys). Optional per-mode ``capacity`` and ``latency_sketches``
#:     (issue #20: requests/s at saturation, per-size latency quantiles with and without the
#:     sidecar; written only when measured, absent in older documents).
#:     Later the same day, optional top-level ``microarch`` (issue #19: instructions, simulated
#:     cache misses and branches per request; its own ``format``, see
#:     :mod:`meshtax.model.microarch`; absent in older documents).
#:     2026-11-26: optional per-mode ``idle_cpu_us_per_s`` (issue #14: the idle proxy's CPU
#:     per second, kept out of the per-message CPU models; absent in older documents, whose
#:     models still carry it). Optional platform ``architecture`` (issue #18: ``node-l4`` or
#:     ``waypoint``, a profile of Envoy in that role, measured on the node bed; written only
#:     when set). Optional top-level ``transfer`` (issue #14: per mode, the factor the
#:     per-message costs take on applications, measured on a validation suite's calibration
#:     set, :mod:`meshtax.model.transfer`; written only when set).
PROFILE_FORMAT = 2


@dataclass(frozen=True)
class Platform:
    """What a profile was measured on. Profiles of different platforms are never mixed."""

    cpu_model: str
    cores: int
    kernel: str
    proxy: str = "envoy"
    proxy_version: str = ""
    config_hash: str = ""
    variant: str = ""  # how the sidecar's app-facing legs differ from loopback TCP, copying
    architecture: str = ""  # the proxy's role when not a sidecar: node-l4 or waypoint

    @property
    def key(self) -> str:
        """Stable identifier of the platform (hash of every field)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def same_host(self, other: Platform) -> bool:
        """Same CPU model, core count and kernel (the proxy may still differ)."""
        return (self.cpu_model, self.cores, self.kernel) == (
            other.cpu_model,
            other.cores,
            other.kernel,
        )

    def describe(self) -> str:
        proxy = f"{self.proxy} {self.proxy_version}".strip()
        variant = f" ({self.variant})" if self.variant else ""
        role = f" as {self.architecture}" if self.architecture else ""
        return f"{self.cpu_model}, {self.cores} cores, Linux {self.kernel}, {proxy}{variant}{role}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "cpu_model": self.cpu_model,
            "cores": self.cores,
            "kernel": self.kernel,
            "proxy": self.proxy,
            "proxy_version": self.proxy_version,
            "config_hash": self.config_hash,
        }
        if self.variant:
            d["variant"] = self.variant
        if self.architecture:
            d["architecture"] = self.architecture
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Platform:
        return cls(
            cpu_model=str(d["cpu_model"]),
            cores=int(d["cores"]),
            kernel=str(d["kernel"]),
            proxy=str(d.get("proxy", "envoy")),
            proxy_version=str(d.get("proxy_version", "")),
            config_hash=str(d.get("config_hash", "")),
            variant=str(d.get("variant", "")),
            architecture=str(d.get("architecture", "")),
        )


@dataclass(frozen=True)
class Provenance:
    """Who or what produced a profile, when, and with which options."""

    source: str  # "measured" | "published" | "derived"
    by: str
    created: str
    tool_version: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "by": self.by,
            "created": self.created,
            "tool_version": self.tool_version,
            "options": dict(self.options),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Provenance:
        return cls(
            source=str(d["source"]),
            by=str(d["by"]),
            created=str(d["created"]),
            tool_version=str(d.get("tool_version", "")),
            options=dict(d.get("options", {})),
            notes=tuple(d.get("notes", ())),
        )


@dataclass(frozen=True)
class Closure:
    """Does the sum of components match the directly measured overhead?"""

    measured_us: float
    measured_lo_us: float
    measured_hi_us: float
    components_us: float
    tolerance: float

    @property
    def error(self) -> float:
        return (
            (self.components_us - self.measured_us) / self.measured_us
            if self.measured_us
            else float("inf")
        )

    @property
    def closes(self) -> bool:
        return abs(self.error) <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured_us": self.measured_us,
            "measured_lo_us": self.measured_lo_us,
            "measured_hi_us": self.measured_hi_us,
            "components_us": self.components_us,
            "tolerance": self.tolerance,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Closure:
        return cls(
            **{
                k: float(d[k])
                for k in (
                    "measured_us",
                    "measured_lo_us",
                    "measured_hi_us",
                    "components_us",
                    "tolerance",
                )
            }
        )


@dataclass(frozen=True)
class TlsModels:
    """mTLS cost of one TLS version (``"1.2"``, ``"1.3"``): ``per_message`` per crossing (the
    shape of the ``tls`` component) and ``handshake`` per new connection per sidecar (the
    shape of :attr:`ModeProfile.tls_handshake`)."""

    version: str
    per_message: ComponentModel | None = None
    handshake: ComponentModel | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "per_message": None if self.per_message is None else self.per_message.to_dict(),
            "handshake": None if self.handshake is None else self.handshake.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TlsModels:
        return cls(
            version=str(d["version"]),
            per_message=None
            if d.get("per_message") is None
            else ComponentModel.from_dict(d["per_message"]),
            handshake=None
            if d.get("handshake") is None
            else ComponentModel.from_dict(d["handshake"]),
        )


@dataclass(frozen=True)
class ModeProfile:
    """Component models of one protocol mode. Filters are components of kind FILTER.

    ``memory``/``memory_mtls``: the proxy's resident memory in bytes against its number of
    open downstream connections (``M + n·m``), plaintext and with mTLS.
    ``tls_handshake``: what one mTLS connection set-up costs one sidecar (latency µs and
    CPU-µs per connection, as intercepts), apart from the per-message TLS component.
    ``carried``: this mode's components measured with another application protocol on the
    wire, by protocol (``"grpc"``, ``"http"``). A tcp-mode sidecar does not parse, but what
    it forwards still matters: one gRPC call is several TCP writes each way (HEADERS, DATA,
    trailers, flow-control and BDP pings), so it costs more than one echoed message. The
    engine prices an invocation of that protocol with these models; the top-level
    ``components`` are for raw byte streams (or an unknown protocol).
    ``tls_version``: the TLS version the ``tls`` component and ``tls_handshake`` are for
    (None: not recorded; profiles before it was recorded measured TLS 1.3).
    ``tls_by_version``: mTLS models of every measured TLS version, by version.
    ``per_connection``: per new downstream connection through one sidecar (latency µs and
    CPU-µs as intercepts) of components that run once per connection, not per message
    (network RBAC, ``filter:rbac_network_N``); their per-message models stay in ``components``.
    ``capacity``/``latency_sketches``: requests/s at saturation and per-size latency quantiles
    with and without the sidecar (:mod:`meshtax.model.capacity`; None/empty: not measured).
    ``idle_cpu_us_per_s``: CPU-µs per second one idle proxy of this mode burns (timers, stats
    flushes) — a cost per sidecar and second, kept out of the per-message CPU models (None:
    not measured; those models then carry it, spread over the profile's own rates).
    """

    mode: Mode
    components: Mapping[Component, ComponentModel]
    closure: Closure | None = None
    memory: CostModel | None = None
    memory_mtls: CostModel | None = None
    tls_handshake: ComponentModel | None = None
    carried: Mapping[str, ModeProfile] = field(default_factory=dict)
    tls_version: str | None = None
    tls_by_version: Mapping[str, TlsModels] = field(default_factory=dict)
    per_connection: Mapping[Component, ComponentModel] = field(default_factory=dict)
    capacity: Capacity | None = None
    latency_sketches: Mapping[int, LatencySketch] = field(default_factory=dict)
    idle_cpu_us_per_s: float | None = None

    def filters(self) -> tuple[str, ...]:
        return tuple(sorted(c.name for c in self.components if c.name))

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "components": {c.key: m.to_dict() for c, m in sorted(self.components.items())},
            "closure": None if self.closure is None else self.closure.to_dict(),
            "memory": None if self.memory is None else self.memory.to_dict(),
            "memory_mtls": None if self.memory_mtls is None else self.memory_mtls.to_dict(),
            "tls_handshake": None if self.tls_handshake is None else self.tls_handshake.to_dict(),
            "carried": {p: mp.to_dict() for p, mp in sorted(self.carried.items())},
            # written only when set, so documents without them keep their exact shape
            **({} if self.tls_version is None else {"tls_version": self.tls_version}),
            **(
                {"tls_by_version": {v: t.to_dict() for v, t in sorted(self.tls_by_version.items())}}
                if self.tls_by_version
                else {}
            ),
            **(
                {
                    "per_connection": {
                        c.key: m.to_dict() for c, m in sorted(self.per_connection.items())
                    }
                }
                if self.per_connection
                else {}
            ),
            **({} if self.capacity is None else {"capacity": self.capacity.to_dict()}),
            **(
                {
                    "latency_sketches": [
                        s.to_dict() for _, s in sorted(self.latency_sketches.items())
                    ]
                }
                if self.latency_sketches
                else {}
            ),
            **(
                {}
                if self.idle_cpu_us_per_s is None
                else {"idle_cpu_us_per_s": self.idle_cpu_us_per_s}
            ),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModeProfile:
        return cls(
            mode=Mode(d["mode"]),
            components={
                Component.parse(k): ComponentModel.from_dict(v) for k, v in d["components"].items()
            },
            closure=None if d.get("closure") is None else Closure.from_dict(d["closure"]),
            memory=None if d.get("memory") is None else CostModel.from_dict(d["memory"]),
            memory_mtls=None
            if d.get("memory_mtls") is None
            else CostModel.from_dict(d["memory_mtls"]),
            tls_handshake=None
            if d.get("tls_handshake") is None
            else ComponentModel.from_dict(d["tls_handshake"]),
            carried={str(p): ModeProfile.from_dict(v) for p, v in (d.get("carried") or {}).items()},
            tls_version=None if d.get("tls_version") is None else str(d["tls_version"]),
            tls_by_version={
                str(v): TlsModels.from_dict(t) for v, t in (d.get("tls_by_version") or {}).items()
            },
            per_connection={
                Component.parse(k): ComponentModel.from_dict(v)
                for k, v in (d.get("per_connection") or {}).items()
            },
            capacity=None if d.get("capacity") is None else Capacity.from_dict(d["capacity"]),
            latency_sketches=sketches_from_list(d.get("latency_sketches")),
            idle_cpu_us_per_s=None
            if d.get("idle_cpu_us_per_s") is None
            else float(d["idle_cpu_us_per_s"]),
        )


@dataclass(frozen=True)
class Profile:
    """A platform's sidecar cost models, per protocol mode, with provenance.

    Models are per message crossing one sidecar once (one direction); a request and its
    response through one sidecar cost two such crossings. ``microarch``: counts per request
    (instructions, cache misses, branches), when measured.
    """

    name: str
    platform: Platform
    provenance: Provenance
    modes: Mapping[Mode, ModeProfile]
    speed: Speed | None = None
    interference: Mapping[str, Any] = field(default_factory=dict)
    status: str | None = None  # closed | unclosed (None: not recorded; see unclosed_modes)
    microarch: Microarch | None = None
    transfer: Transfer | None = None

    @property
    def unclosed_modes(self) -> tuple[Mode, ...]:
        """Measured modes whose components do not add up to the measured overhead."""
        return tuple(
            m for m, mp in self.modes.items() if mp.closure is not None and not mp.closure.closes
        )

    @property
    def unclosed(self) -> bool:
        """The profile failed its closure check (recorded by the profiler, or seen now)."""
        return self.status == "unclosed" or bool(self.unclosed_modes)

    def carried_closures(self) -> dict[tuple[Mode, str], Closure]:
        """Closure of each carried model (tcp, grpc: a tcp-mode sidecar in front of a gRPC
        app), by mode and protocol. Not part of :attr:`unclosed`: the mode's own closure
        decides that; a carried model that does not close is said wherever it is used."""
        return {
            (m, proto): c.closure
            for m, mp in self.modes.items()
            for proto, c in sorted(mp.carried.items())
            if c.closure is not None
        }

    def quality(self) -> dict[str, Any]:
        """How far to trust the profile, for every output made with it: closure per mode and
        per carried model, what else ran while it measured, the machine's speed then."""
        closures = {m.value: mp.closure for m, mp in self.modes.items() if mp.closure}
        status = self.status or (
            "unclosed" if self.unclosed else "closed" if closures else "unchecked"
        )
        closures |= {f"{m.value}+{p}": c for (m, p), c in self.carried_closures().items()}
        return {
            "status": status,
            "closure": {
                m: {
                    "components_us": c.components_us,
                    "measured_us": c.measured_us,
                    "error": c.error,
                    "tolerance": c.tolerance,
                }
                for m, c in closures.items()
            },
            "interference": {k: v for k, v in self.interference.items() if k != "by_size"},
            "speed": None if self.speed is None else self.speed.to_dict(),
            **({} if self.transfer is None else {"transfer": self.transfer.to_dict()}),
        }

    def mode(self, mode: Mode) -> ModeProfile:
        try:
            return self.modes[mode]
        except KeyError:
            have = ", ".join(m.value for m in self.modes) or "none"
            raise KeyError(
                f"profile {self.name!r} has no {mode.value} mode (has: {have})"
            ) from None

    def with_modes(self, modes: Iterable[ModeProfile], **changes: Any) -> Profile:
        return replace(self, modes={m.mode: m for m in modes}, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "name": self.name,
            "platform": self.platform.to_dict(),
            "provenance": self.provenance.to_dict(),
            "modes": {m.value: mp.to_dict() for m, mp in self.modes.items()},
            **({"speed": self.speed.to_dict()} if self.speed is not None else {}),
            **({"interference": dict(self.interference)} if self.interference else {}),
            **({"status": self.status} if self.status is not None else {}),
            **({} if self.microarch is None else {"microarch": self.microarch.to_dict()}),
            **({} if self.transfer is None else {"transfer": self.transfer.to_dict()}),
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "<profile>") -> Profile:
        """A validated profile: the document's types against :data:`PROFILE_SCHEMA`, then
        :func:`profile_problems`; every problem is raised together as a :class:`ProfileError`."""
        from meshtax.model.profile_check import ProfileError, doc_problems, profile_problems

        bad = doc_problems(d, PROFILE_FORMAT)
        if bad:
            raise ProfileError(source, bad)
        try:
            p = cls._build(d)
        except (ValueError, KeyError, TypeError) as e:
            raise ProfileError(source, [str(e).strip("'\"")]) from None
        bad = profile_problems(p)
        if bad:
            raise ProfileError(source, bad)
        return p

    @classmethod
    def _build(cls, d: Mapping[str, Any]) -> Profile:
        return cls(
            name=str(d["name"]),
            platform=Platform.from_dict(d["platform"]),
            provenance=Provenance.from_dict(d["provenance"]),
            modes={Mode(k): ModeProfile.from_dict(v) for k, v in d["modes"].items()},
            speed=Speed.from_dict(d["speed"]) if d.get("speed") else None,
            interference=dict(d.get("interference") or {}),
            status=None if d.get("status") is None else str(d["status"]),
            microarch=None if d.get("microarch") is None else Microarch.from_dict(d["microarch"]),
            transfer=None if d.get("transfer") is None else Transfer.from_dict(d["transfer"]),
        )
