"""``meshtax profiles show``: a mode's carried models (gRPC through a tcp-mode sidecar) get
columns of their own, next to the mode's."""

from __future__ import annotations

from dataclasses import replace

from meshtax.model.components import Component, Kind
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import Closure, ModeProfile
from meshtax.model.sidecar import Mode
from meshtax.report.text import profile_text
from tests.report import data as D


def test_carried_models_get_their_own_columns_and_closure() -> None:
    prof = D.golden_profile()
    tcp = prof.modes[Mode.TCP]
    grpc_on_tcp = ModeProfile(
        Mode.TCP,
        {
            Component(Kind.IPC): ComponentModel(CostModel(5.0), CostModel(10.0)),
            Component(Kind.OTHER): ComponentModel(CostModel(7.0), CostModel(25.0)),
        },
        Closure(10.0, 9.0, 11.0, 12.0, 0.15),
    )
    prof = replace(
        prof, modes={**prof.modes, Mode.TCP: replace(tcp, carried={"grpc": grpc_on_tcp})}
    )
    lines = profile_text(prof, 100.0, 1000.0).splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("component"))
    header = lines[head]  # the line above holds wrapped header words
    # the carried columns sit right after tcp's own, before http's
    assert (
        header.index("tcp CPU") < header.index("(vCPU)  http latency")
        and "tcp+grpc" in lines[head - 1]
    )
    ipc = next(ln for ln in lines if ln.startswith("IPC")).split()
    # tcp: 2 × (2.5 + 0.1) µs, 2 × (4 + 0.2) µs × 1000/s; tcp+grpc: 2 × 5 µs, 2 × 10 µs × 1000/s
    assert ipc[1:5] == ["5.20", "0.01", "10.00", "0.02"]
    total = next(ln for ln in lines if ln.startswith("total")).split()
    assert total[4:6] == [
        "24.00",
        "0.07",
    ]  # "total (without filters)": golden has a filter  # 2 × (5 + 7) µs; 2 × (10 + 25) µs × 1000/s
    # a component the carried models lack is "-" in their columns, not zero
    read = next(ln for ln in lines if ln.startswith("Read")).split()
    assert read[3:5] == ["-", "-"]
    assert any(
        ln.startswith("closure tcp+grpc: components 12.0 µs vs measured 10.0 µs") for ln in lines
    )
    assert any(ln.startswith("closure tcp: ") for ln in lines)
