"""Microarch tables with exact numbers; additivity, published ratios, run-to-run agreement;
every output format; the HTML report section and ``profiles show --microarch``."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from meshtax.model.components import OTHER
from meshtax.model.microarch import CounterRow, KernelRow, Microarch
from meshtax.model.sidecar import Mode
from meshtax.report.build import ReportInputs, render_report
from meshtax.report.microarch import (
    additivity,
    agreement,
    components_table,
    counts_table,
    microarch_document,
    microarch_text,
    published_ratios,
    published_table,
    spread_table,
    topdown_table,
)
from meshtax.report.text import profile_text
from tests.helpers import flat, profile

BASE_EV = {
    **{"Ir": 200e3, "I1mr": 6e3, "D1mr": 2e3, "D1mw": 600.0, "ILmr": 0.5, "DLmr": 0.0, "DLmw": 0.0},
    **{"Bc": 30e3, "Bcm": 1.5e3, "Bi": 3e3, "Bim": 2e3},
}


def _row(variant: str, ir: float, members: tuple[str, ...] = (), mode: str = "http") -> CounterRow:
    ev = {**BASE_EV, "Ir": ir, "I1mr": ir * 0.03}
    return CounterRow(mode, variant, 100, 100, 500, 100, ev, {"Ir": 4e5}, {"Ir": 9e5}, members)


MICRO = Microarch(
    "valgrind",
    "valgrind-3.19.0 --tool=callgrind (cache and branch simulation)",
    (
        _row("base", 200e3),
        _row("ip_tagging_1", 210e3),
        _row("ip_tagging_5", 216e3),
        _row("rbac_http_10000", 4.2e6),
        _row("rate_limit", 206e3),
        _row("http_mix_1", 216.2e3, ("rate_limit", "ip_tagging_1")),
        _row("base", 100e3, mode="tcp"),
    ),
    kernel=(KernelRow("tcp", 100, 2000, 3.0, 1.0, 1.0, 0.9, 12.5, 8.0),),
    attribution="none: whole-process numbers",
)


def test_counts_table() -> None:
    t = counts_table(MICRO)
    rows = {(r[0], r[2]): r for r in t.rows}
    assert rows[("http", "base")][3:10] == ["200,000", "—", "—", "30.00", "13.00", "0.00", "17.50"]
    assert rows[("http", "ip_tagging_1")][3:7] == ["210,000", "+10,000", "+5.0", "30.00"]
    assert rows[("http", "base")][-2:] == ["400,000", "900,000"]
    assert rows[("tcp", "base")][4] == "—"  # its own mode's base
    # a window difference a hair below zero reads 0.00, not -0.00
    tiny = dataclasses.replace(MICRO.rows[0], per_request={**BASE_EV, "ILmr": -0.4})
    assert counts_table(dataclasses.replace(MICRO, rows=(tiny,))).rows[0][8] == "0.00"
    assert "IPC" not in t.head


def test_pmu_rows_have_ipc_and_a_top_down_split() -> None:
    ev = {"instructions": 2e5, "cycles": 4e5, "slots": 8e5, "topdown-retiring": 2e5}
    ev |= {"topdown-bad-spec": 4e4, "topdown-fe-bound": 2e5, "topdown-be-bound": 3.6e5}
    pmu = Microarch("pmu", "perf", (CounterRow("http", "base", 100, 100, 500, 100, ev),))
    counts = counts_table(pmu)
    assert counts.rows[0][counts.head.index("IPC")] == "0.50"
    td = topdown_table(pmu)
    assert td is not None and td.rows == [["http", "100", "base", "25.0", "5.0", "25.0", "45.0"]]
    assert "Top-down" in microarch_text(pmu)
    assert topdown_table(MICRO) is None  # valgrind simulates no pipeline


def test_components_by_difference() -> None:
    t = components_table(MICRO)
    assert t is not None
    rows = [r[:4] for r in t.rows]
    assert rows[:4] == [
        ["http", "100", "Other", "100,000"],
        ["http", "100", "Parsing", "100,000"],
        ["http", "100", "Filter(ip_tagging_1)", "10,000"],
        ["http", "100", "Filter(ip_tagging_5)", "16,000"],
    ]
    assert ["tcp", "100", "Other", "100,000"] in rows
    assert not any(r[2] == "Filter(http_mix_1)" for r in rows)  # chains are not components


def test_additivity_on_instructions() -> None:
    (a,) = additivity(MICRO)
    assert (a.chain, a.members, a.base) == ("http_mix_1", ("rate_limit", "ip_tagging_1"), 200e3)
    assert a.predicted == pytest.approx(216e3) and a.measured == 216.2e3
    assert a.error == pytest.approx(216 / 216.2 - 1)
    assert a.increment_error == pytest.approx(-0.2 / 16.2)


def test_published_ratios_and_branches() -> None:
    got = {(p, v): (round(here, 6), pub) for p, v, here, pub in published_ratios(MICRO)}
    assert got == {
        ("ip_tag_1", "ip_tagging_1"): (1.05, 1.052),
        ("ip_tag_5", "ip_tagging_5"): (1.08, 1.088),
        ("rbac_10k", "rbac_http_10000"): (21.0, 1.014),
    }
    t = published_table(MICRO)
    assert t is not None
    cond = [r for r in t.rows if r[1] == "base, conditional"]
    assert cond == [
        ["branches / request", "base, conditional", "30,000", "32,780", "—"],
        ["mispredicted / request", "base, conditional", "1,500", "2,300", "—"],
    ]
    assert any("Sahu" in n for n in t.notes)
    assert published_ratios(MICRO, "grpc") == []


def test_agreement() -> None:
    b = dataclasses.replace(
        MICRO,
        rows=tuple(
            dataclasses.replace(r, per_request={**r.per_request, "Ir": r.per_request["Ir"] * 1.01})
            if r.variant == "base"
            else r
            for r in MICRO.rows
        ),
    )
    items = agreement(MICRO, b)
    by = {(x.mode, x.variant, x.metric): x for x in items}
    assert by[("http", "base", "instructions")].rel == pytest.approx(0.01)
    assert by[("http", "base", "instructions")].ok
    # LL misses (0.5 per request) are below the floor: not compared, not a failure
    assert by[("http", "base", "ll_misses")].rel is None and by[("http", "base", "ll_misses")].ok
    assert by[("http", "ip_tagging_1", "i1_misses")].rel == 0.0
    worse = dataclasses.replace(
        b, rows=(dataclasses.replace(b.rows[0], per_request={"Ir": 2e5 * 1.03}),)
    )
    (x,) = [i for i in agreement(MICRO, worse) if i.metric == "instructions"]
    assert not x.ok and x.bound == 0.02


def test_spread_of_the_window_pairs() -> None:
    """Each row's pairs, shown as ± half their range over the median; agreement carries the
    larger of the two rows' spreads; a one-pair row (format 1) has none."""
    d1 = ({"D1mr": 2.0, "D1mw": 0.2}, {"D1mr": 2.1, "D1mw": 0.2}, {"D1mr": 2.3, "D1mw": 0.2})
    pairs = tuple({**BASE_EV, "Ir": ir, **d} for ir, d in zip((99e3, 100e3, 101e3), d1))
    tcp = dataclasses.replace(MICRO.rows[-1], per_request=pairs[1], pairs=pairs)
    m = dataclasses.replace(MICRO, rows=(MICRO.rows[0], tcp))
    t = spread_table(m)
    assert t is not None and t.head[3:] == (
        "pairs",
        "n1 / n2",
        "instructions",
        "I1 misses",
        "D1 misses",
        "branch mispredictions",
    )
    assert t.rows == [["tcp", "100", "base", "3", "100 / 500", "±1.0%", "±0.0%", "±6.5%", "±0.0%"]]
    assert spread_table(MICRO) is None
    # counted again: every round's windows, and what stayed unresolved in a note
    again = dataclasses.replace(tcp, rounds=((100, 500), (100, 4100)), unresolved=("d1_misses",))
    t = spread_table(dataclasses.replace(m, rows=(again,)))
    assert t is not None and t.rows[0][4] == "100 / 500 → 100 / 4100"
    assert (
        "unresolved after the last round" in t.notes[-1] and "tcp base (D1 misses)" in t.notes[-1]
    )
    wider = dataclasses.replace(tcp, pairs=(pairs[0], pairs[1]))
    (x,) = [
        i for i in agreement(m, dataclasses.replace(m, rows=(wider,))) if i.metric == "d1_misses"
    ]
    assert x.spread == pytest.approx(0.15 / 2.3) and x.rel == 0.0
    rec = list(csv.DictReader(io.StringIO(microarch_document(m, "csv"))))[1]
    assert rec["pairs"] == "3" and float(rec["d1_misses_spread"]) == pytest.approx(0.15 / 2.3)


def test_documents_in_every_format() -> None:
    text = microarch_text(MICRO)
    assert "Instructions and misses per request" in text and "http_mix_1" in text
    assert "Filter additivity on instructions per request" in text
    assert "Kernel work per request (from the base profile)" in text
    assert "attribution: none: whole-process numbers" in text
    doc = json.loads(microarch_document(MICRO, "json"))
    assert Microarch.from_dict(doc) == MICRO
    recs = list(csv.DictReader(io.StringIO(microarch_document(MICRO, "csv"))))
    assert recs[0]["variant"] == "base" and float(recs[0]["instructions"]) == 200e3
    assert recs[0]["cycles"] == "" and float(recs[0]["fixed_instructions"]) == 4e5
    md = microarch_document(MICRO, "markdown")
    assert md.startswith("## Microarchitecture") and "| http | 100 | base |" in md
    html = microarch_document(MICRO, "html")
    assert html.startswith("<!DOCTYPE html>") and "Filter additivity" in html


def test_report_and_profile_text_show_it() -> None:
    p = dataclasses.replace(profile({Mode.HTTP: {OTHER: flat(1, 2)}}, name="m"), microarch=MICRO)
    rep = render_report([], [p.to_dict()], ReportInputs(created="2026-11-23"))
    assert "Microarchitecture" in rep.html and "Filter additivity on instructions" in rep.html
    assert "`meshtax profiles show m --microarch`" in profile_text(p)
    plain = profile({Mode.HTTP: {OTHER: flat(1, 2)}})
    assert "Microarchitecture" not in render_report([], [plain.to_dict()], ReportInputs()).html


def test_profiles_show_microarch(tmp_path: Path) -> None:
    from meshtax.cli import main
    from meshtax.store.sqlite import ProfileStore

    db = tmp_path / "p.db"
    store = ProfileStore(db)
    store.save(
        dataclasses.replace(profile({Mode.HTTP: {OTHER: flat(1, 2)}}, name="m"), microarch=MICRO)
    )
    store.save(profile({Mode.HTTP: {OTHER: flat(1, 2)}}, name="plain"))
    run = CliRunner().invoke(main, ["profiles", "show", "m", "--microarch", "--db", str(db)])
    assert run.exit_code == 0, run.output
    assert "rbac_http_10000" in run.output and "4,200,000" in run.output
    run = CliRunner().invoke(
        main, ["profiles", "show", "m", "--microarch", "--format", "json", "--db", str(db)]
    )
    assert json.loads(run.output)["source"] == "valgrind"
    run = CliRunner().invoke(main, ["profiles", "show", "plain", "--microarch", "--db", str(db)])
    assert run.exit_code == 2 and "--microarch --base plain" in run.output
