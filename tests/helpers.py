"""Small builders shared by tests: profiles with exact per-crossing costs, tiny ECGs."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from meshtax.model.components import Component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import ECG, EXTERNAL, Invocation, Service, validate
from meshtax.model.profile import ModeProfile, Platform, Profile, Provenance
from meshtax.model.sidecar import Mode, SidecarConfig

PLATFORM = Platform("Test CPU", 2, "6.0", "envoy", "1.40", "cfg")


def flat(
    latency: float, cpu: float, slope_lat: float = 0.0, slope_cpu: float = 0.0
) -> ComponentModel:
    return ComponentModel(CostModel(latency, slope_lat), CostModel(cpu, slope_cpu))


def profile(
    modes: Mapping[Mode, Mapping[Component, ComponentModel]], name: str = "test"
) -> Profile:
    return Profile(
        name,
        PLATFORM,
        Provenance("measured", "tests", "2026-11-22T00:00:00+00:00"),
        {m: ModeProfile(m, dict(c)) for m, c in modes.items()},
    )


def inv(
    id: str,
    caller: str,
    callee: str,
    start: float,
    dur: float,
    parent: str | None = None,
    req: float = 100,
    resp: float = 100,
    rate: float = 1000,
) -> Invocation:
    return Invocation(id, caller, callee, req, resp, rate, start, dur, parent)


def ecg(services: Mapping[str, SidecarConfig], invs: list[Invocation], name: str = "g") -> ECG:
    return validate(name, {n: Service(n, c) for n, c in services.items()}, invs)


def default_sigint() -> None:
    """``preexec_fn`` for a child a test will interrupt: SIGINT back to its default. A shell
    that starts the suite in the background (``cmd &``, nohup) ignores SIGINT, the child would
    inherit that, and Ctrl-C tests would then test nothing (or hang)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def missing_for_real_profile() -> str | None:
    """Why a real profiling run cannot happen here (root, tools, Envoy, fortio, the eBPF
    probe), or None; a missing piece is a skip reason, said plainly."""
    import os
    import shutil

    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "iptables", "perf", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    from meshtax.testbed.tools import FIX, Tool, find_tool

    names: tuple[Tool, ...] = ("envoy", "fortio", "probe")
    for name in names:
        if find_tool(name) is None:
            return f"{name} not installed: {FIX[name]}"
    return None


__all__ = [
    "EXTERNAL",
    "flat",
    "profile",
    "inv",
    "ecg",
    "PLATFORM",
    "default_sigint",
    "missing_for_real_profile",
]


def needs(*tools: str) -> pytest.MarkDecorator:
    """Skip unless every tool (envoy, fortio, meshapp, probe) is installed, saying which is not."""
    from meshtax.testbed.tools import find_tool

    missing = [t for t in tools if find_tool(t) is None]  # type: ignore[arg-type]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")
