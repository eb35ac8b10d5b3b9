"""Counter sources: perf stat parsing and detection on a fake system, the valgrind counter on
a fake process (every thread apart), the PMU counter's windows, the fake source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from meshtax.testbed.callgrind import CallgrindDump, CallgrindSpec
from meshtax.testbed.counters import (
    PMU_EVENTS,
    TOPDOWN_EVENTS,
    WHOLE,
    FakeCounterSource,
    PmuSource,
    ValgrindSource,
    detect_source,
    parse_perf_stat,
    pmu_events,
)
from meshtax.testbed.system import Completed, FakeSystem

NOT_SUPPORTED = "<not supported>,,instructions,0,100.00,,\n<not supported>,,cycles,0,100.00,,\n"


def perf_answers(counted: set[str]) -> FakeSystem:
    """``perf stat -x, -e E true`` counts the events in ``counted`` (others: not supported)."""

    def r(argv: tuple[str, ...]) -> Completed | None:
        if argv[:2] != ("perf", "stat") or argv[-1] != "true":
            return None
        events = argv[argv.index("-e") + 1].split(",")
        lines = [
            f"{1000 + i},,{e},1000,100.00,," if e in counted else f"<not supported>,,{e},0,100.00,,"
            for i, e in enumerate(events)
        ]
        return Completed(argv, 0, "", "\n".join(lines) + "\n")

    return FakeSystem(responders=[r])


def test_parse_perf_stat() -> None:
    text = (
        "# started on Mon\n\n"
        "123456,,instructions,2000,100.00,0.80,insn per cycle\n"
        "154321,,cycles,2000,100.00,,\n"
        "<not counted>,,branches,0,0.00,,\n" + NOT_SUPPORTED
    )
    assert parse_perf_stat(text) == {"instructions": 123456.0, "cycles": 154321.0}


def test_pmu_events_and_detection() -> None:
    none = perf_answers(set())
    assert pmu_events(none) == ()
    src, why = detect_source(none, valgrind=lambda: True)
    assert isinstance(src, ValgrindSource) and "no hardware counters" in why
    src, why = detect_source(none, valgrind=lambda: False)
    assert src is None and "no valgrind" in why
    some = perf_answers({"instructions", "cycles", "branches", "slots", "topdown-retiring"})
    # the top-down group counts together or not at all
    assert pmu_events(some) == ("instructions", "cycles", "branches")
    src, why = detect_source(some, valgrind=lambda: True)
    assert isinstance(src, PmuSource) and src.events == ("instructions", "cycles", "branches")
    assert "hardware counters" in why
    every = perf_answers(set(PMU_EVENTS) | set(TOPDOWN_EVENTS))
    assert pmu_events(every) == PMU_EVENTS + TOPDOWN_EVENTS


@dataclass
class FakeCallgrind:
    """Dumps per thread: thread 1 (main) and 6 (worker) count ``per_dump`` each time."""

    pid: int = 77
    zeroed: int = 0
    dumps: list[bool] = field(default_factory=list)

    def zero(self) -> None:
        self.zeroed += 1

    def dump_threads(self, *, functions: bool = False) -> Mapping[int, CallgrindDump]:
        self.dumps.append(functions)
        fns = {("/e", "f"): {"Ir": 90}} if functions else {}
        return {
            1: CallgrindDump(("Ir", "I1mr"), {"Ir": 500, "I1mr": 5}),
            6: CallgrindDump(("Ir", "I1mr"), {"Ir": 100, "I1mr": 3}, None, fns),
            7: CallgrindDump(("Ir", "I1mr"), {"Ir": 1, "I1mr": 0}),
        }


def test_valgrind_counter_keeps_every_thread_apart(tmp_path: Path) -> None:
    proc = FakeCallgrind()
    src = ValgrindSource(functions=True)
    assert src.callgrind == CallgrindSpec(True, True, None, separate_threads=True)
    c = src.open(proc, FakeSystem(), tmp_path)
    c.zero()
    got = c.read()
    assert proc.zeroed == 1 and proc.dumps == [True]
    assert got.threads == {
        1: {"Ir": 500.0, "I1mr": 5.0},
        6: {"Ir": 100.0, "I1mr": 3.0},
        7: {"Ir": 1.0, "I1mr": 0.0},
    }
    assert got.events() == {"Ir": 601.0, "I1mr": 8.0}
    assert got.events({6, 7}) == {"Ir": 101.0, "I1mr": 3.0}
    assert got.costs() == got.costs({6}) == {("/e", "f"): {"Ir": 90.0}}
    assert got.costs({1, 7}) == {}


def test_valgrind_tool_names_the_simulators() -> None:
    sysm = FakeSystem(
        responders=[
            lambda a: Completed(a, 0, "valgrind-3.19.0\n", "") if a[1:] == ("--version",) else None
        ]
    )
    assert ValgrindSource().tool(sysm) == (
        "valgrind-3.19.0 --tool=callgrind (cache and branch simulation)"
    )


def test_pmu_counter_windows(tmp_path: Path) -> None:
    """Each window is one ``perf stat -p`` run, stopped by SIGINT; reading starts the next."""
    sysm = FakeSystem()
    c = PmuSource(("instructions", "cycles")).open(FakeCallgrind(pid=99), sysm, tmp_path)
    c.zero()
    spawned = [a for a in sysm.calls if a[:2] == ("perf", "stat")]
    assert spawned == [
        (
            "perf",
            "stat",
            "-x,",
            "-e",
            "instructions:u,cycles:u",
            "-p",
            "99",
            "-o",
            str(tmp_path / "perf-stat.1"),
        )
    ]
    (tmp_path / "perf-stat.1").write_text(
        "5000,,instructions,9,100.00,,\n8000,,cycles,9,100.00,,\n"
    )
    got = c.read()
    assert got.threads == {WHOLE: {"instructions": 5000.0, "cycles": 8000.0}}
    pid = sysm.processes[0].pid
    assert ("kill", "-s", "INT", str(pid)) in sysm.calls
    assert len(sysm.processes) == 2  # the next window runs
    c.close()
    assert sysm.calls[-1] == ("kill", "-s", "INT", str(sysm.processes[1].pid))


def test_fake_source_counts_differences(tmp_path: Path) -> None:
    total = {"Ir": 10.0}
    src = FakeCounterSource(lambda: total)
    c = src.open(FakeCallgrind(), FakeSystem(), tmp_path)
    c.zero()
    total["Ir"] = 25.0
    assert c.read().threads == {WHOLE: {"Ir": 15.0}}
    total["Ir"] = 26.0
    assert c.read().events() == {"Ir": 1.0}
    assert src.opened == [77] and src.name == "valgrind" and src.callgrind is None


def test_fake_source_by_thread(tmp_path: Path) -> None:
    per = {1: {"Ir": 5.0}, 6: {"Ir": 100.0}}
    c = FakeCounterSource(lambda: {}, threads=lambda: per).open(
        FakeCallgrind(), FakeSystem(), tmp_path
    )
    c.zero()
    per = {1: {"Ir": 7.0}, 6: {"Ir": 300.0}, 9: {"Ir": 1.0}}  # a thread started meanwhile
    assert c.read().threads == {1: {"Ir": 2.0}, 6: {"Ir": 200.0}, 9: {"Ir": 1.0}}
