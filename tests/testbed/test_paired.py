"""The one paired-run loop: group orders, rotation, stopping rules (exact expectations)."""

from __future__ import annotations

import pytest

from meshtax.testbed.paired import PairPolicy, group_order, is_narrow, paired_runs


def test_group_order() -> None:
    assert group_order(["a", "b"], 0) == ["a", "b"]
    assert group_order(["a", "b"], 1) == ["b", "a"]
    assert group_order(["a", "b", "c"], 0, "palindrome") == ["a", "b", "c", "c", "b", "a"]
    assert group_order(["a", "b", "c"], 4, "palindrome") == ["b", "c", "a", "a", "c", "b"]
    assert group_order([], 3, "palindrome") == []


def test_groups_rotate_and_alternate_each_round() -> None:
    ran: list[str] = []

    def run(n: str) -> int:
        ran.append(n)
        return len(ran)

    p = paired_runs([("base", "x"), ("base", "y")], run, PairPolicy.fixed(2))
    assert ran == ["base", "x", "base", "y", "y", "base", "x", "base"]
    assert p.stop == "max_rounds" and p.rounds == 2
    assert p.pairs("base", "x") == [(1, 2), (8, 7)]
    assert p.runs_of("base") == [1, 3, 6, 8]


def test_palindrome_runs_each_name_twice_and_keeps_first_seen_order() -> None:
    ran: list[str] = []
    p = paired_runs([("b", "m", "c")], lambda n: ran.append(n), PairPolicy.fixed(1, "palindrome"))
    assert ran == ["b", "m", "c", "c", "m", "b"]
    assert list(p.groups[0].runs) == ["b", "m", "c"]
    assert all(len(v) == 2 for v in p.groups[0].runs.values())


def test_stops_when_narrow_from_min_rounds_on() -> None:
    p = paired_runs(
        [("d", "m")],
        lambda n: 10.0 if n == "m" else 0.0,
        PairPolicy(6, 20),
        narrow=lambda r: is_narrow([m - d for d, m in r.pairs("d", "m")], 0.1),
    )
    assert (p.rounds, p.stop) == (6, "narrow")


def test_budget_stops_before_a_group_that_would_overrun() -> None:
    t = [0.0]

    def run(n: str) -> float:
        t[0] += 1.0
        return t[0]

    p = paired_runs([("a", "b")], run, PairPolicy(1, 10, 5.0), clock=lambda: t[0])
    assert (p.rounds, p.stop) == (2, "budget")  # 2 s a pair; a third would end at 6 s


def test_policy_is_checked() -> None:
    with pytest.raises(ValueError):
        PairPolicy(5, 4)
    with pytest.raises(ValueError):
        paired_runs([], lambda n: 0, PairPolicy())


def test_refused_groups_run_again_then_the_loop_gives_up() -> None:
    n = [0]

    def run(name: str) -> int:
        n[0] += 1
        return n[0]

    # every second pair is refused: it is run again, and kept rounds stay complete
    p = paired_runs(
        [("a", "b")],
        run,
        PairPolicy.fixed(3),
        accept=lambda g: g.first("b") != 3,
        max_rejects=5,
    )
    assert p.stop == "max_rounds" and p.rounds == 3 and len(p.rejected) == 1
    assert [g.runs for g in p.rejected] == [{"b": (3,), "a": (4,)}]
    # nothing is ever clean: it stops after max_rejects + 1 refusals with what it kept
    q = paired_runs([("a", "b")], run, PairPolicy.fixed(3), accept=lambda g: False, max_rejects=2)
    assert (q.stop, len(q.groups), len(q.rejected)) == ("contaminated", 0, 3)
