"""benchmarks/microarch_table.py: BENCHMARKS.md's #19 tables from either script's JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _table() -> Any:
    spec = importlib.util.spec_from_file_location("mt", ROOT / "benchmarks/microarch_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _item(variant: str, metric: str, a: float, b: float, bound: float) -> dict[str, Any]:
    rel = None if max(a, b) < 1 else b / a - 1
    ok = rel is None or abs(rel) <= bound
    return {
        "mode": "grpc",
        "variant": variant,
        "metric": metric,
        "a": a,
        "b": b,
        "rel": rel,
        "spread": 0.01,
        "ok": ok,
    }


BENCH = {
    "agreement": [
        {
            "items": [
                _item("base", "instructions", 200_000, 201_000, 0.02),
                _item("base", "d1_misses", 3000, 3200, 0.05),  # +6.7 %: beyond
                _item("base", "ll_misses", 0.2, 0.3, 0.05),  # below one: not compared
            ]
        }
    ],
    "findings": {
        "p-1": {
            "additivity": [
                {"mode": "grpc", "chain": "http_mix_1", "error": 0.01, "increment_error": 0.1}
            ],
            "ratios": [],
        },
        "p-2": {
            "additivity": [
                {"mode": "grpc", "chain": "http_mix_1", "error": -0.02, "increment_error": -0.2}
            ],
            "ratios": [],
        },
    },
}
AGREEMENT_SCRIPT = {
    "mode": "http",
    "agreement": {
        "items": [
            {
                k: v
                for k, v in _item("tap", "instructions", 5e5, 5.05e5, 0.02).items()
                if k != "mode"
            }
        ]
    },
    "additivity": [[["cpp", 0.001, 0.01]], [["cpp", 0.002, 0.02]]],
    "ratios": [[["IP tagging 1", 1.05, 1.052]], [["IP tagging 1", 1.049, 1.052]]],
}


def test_counts_compared_and_beyond(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mt = _table()
    rows, compared, beyond, bad = mt.agreement_rows([BENCH, AGREEMENT_SCRIPT])
    assert (compared, beyond) == (3, 1)
    assert bad == ["grpc base d1_misses +6.67 %"]
    assert rows[0].startswith("| grpc | base | 200 000, 201 000 | +0.50 % |")
    assert "**d1_misses**" in rows[0]
    assert rows[1].startswith("| http | tap | 500 000, 505 000 | +1.00 % |")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(BENCH))
    b.write_text(json.dumps(AGREEMENT_SCRIPT))
    assert mt.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| grpc | http_mix_1 | +1.00 %, -2.00 % | +10.0 %, -20.0 % |" in out
    assert "| http | cpp | +0.10 %, +0.20 % |" in out
    assert "| IP tagging 1 |  | 1.050, 1.049 | 1.052 | 1.00, 1.00 |" in out
    assert "grpc d1_misses 6.67 %" in out


def test_rows_counted_again_are_listed_with_their_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row counted in two rounds in run 1 and left unresolved in run 2 gets a line with
    each run's windows and its counts that may be compared; rows of one round do not."""
    mt = _table()
    ll = {
        **_item("access_log", "ll_misses", 1.02, 0.98, 0.05),
        "rounds": [[[46, 230], [46, 2300]], [[46, 230]]],
        "unresolved": [False, True],
        "first": [1.6, None],
    }
    low = {  # below 0.5 now, but not in the first round: listed with it
        **_item("access_log", "d1_misses", 0.1, 0.09, 0.05),
        "rounds": [[[46, 230], [46, 2300]], [[46, 230]]],
        "first": [0.8, None],
    }
    base = {**_item("base", "ll_misses", 0.02, 0.01, 0.05), "rounds": [[[46, 230]], [[46, 230]]]}
    doc = {**BENCH, "agreement": [{"items": [ll, low, base]}]}
    rows = mt.recount_rows([doc])
    assert len(rows) == 1
    assert "46/230 → 46/2300" in rows[0] and "| 46/230 |" in rows[0]
    assert "LL first round 1.60, — → 1.02, 0.98" in rows[0] and "unresolved in run 2" in rows[0]
    assert "D1 first round 0.80, — → 0.10, 0.09" in rows[0]
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    mt.main([str(p)])
    assert "Rows counted again" in capsys.readouterr().out


def test_bench_microarch_items_carry_each_rows_rounds() -> None:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_microarch as bm
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from meshtax.model.microarch import CounterRow, Microarch

    ll = {"ILmr": 0.0, "DLmr": 0.0}
    row = CounterRow(
        "grpc", "access_log", 100, 46, 2300, 50, {"Ir": 2e5, **ll, "DLmw": 1.0},
        rounds=((46, 230), (46, 2300)), unresolved=("ll_misses",),
        earlier=(({"Ir": 2e5, **ll, "DLmw": 3.0}, {"Ir": 2e5, **ll, "DLmw": 1.0}),),
    )  # fmt: skip
    a = Microarch("valgrind", "t", (row,))
    one = {**row.__dict__, "rounds": ((46, 230),), "earlier": ()}
    b = Microarch("valgrind", "t", (row.__class__(**one),))
    got = {x["metric"]: x for x in bm.compare(a, b)["items"]}
    assert got["ll_misses"]["rounds"] == [[[46, 230], [46, 2300]], [[46, 230]]]
    assert got["ll_misses"]["unresolved"] == [True, True]
    assert got["instructions"]["unresolved"] == [False, False]
    assert got["ll_misses"]["first"] == [2.0, None]  # the first round's median
