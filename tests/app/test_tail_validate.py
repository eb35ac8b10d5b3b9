"""``meshtax validate --sweep rate``: the beds run at the nice value the profile was taken at."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from meshtax.app import tail_validate as tv
from meshtax.model.components import OTHER
from meshtax.model.sidecar import Mode
from tests.helpers import flat, profile


def _prof(nice: Any) -> Any:
    p = profile({Mode.HTTP: {OTHER: flat(25, 50)}})
    opts = {} if nice is None else {"nice": nice}
    return replace(p, provenance=replace(p.provenance, options=opts))


def test_the_validation_measures_at_the_profiles_nice_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #20, sets 7–8: the profile's closed loop (every process at nice −20) came out
    8–15 % below the validation's (nice 0) on a quiet machine; both beds now run alike."""
    now: list[int | None] = [None]
    seen: list[int | None] = []

    @contextlib.contextmanager
    def niceness(nice: int | None) -> Iterator[None]:
        old, now[0] = now[0], nice
        try:
            yield
        finally:
            now[0] = old

    def run_onehop_tail(*_a: Any, **_k: Any) -> str:
        seen.append(now[0])
        return "measured"

    @contextlib.contextmanager
    def testbed(*_a: Any, **_k: Any) -> Iterator[None]:
        yield None

    prof = _prof(-20)
    monkeypatch.setattr(tv, "resolve_profile", lambda *_a, **_k: SimpleNamespace(profile=prof))
    monkeypatch.setattr(tv, "niceness", niceness)
    monkeypatch.setattr(tv, "Testbed", testbed)
    monkeypatch.setattr(tv, "RealSystem", lambda: None)
    monkeypatch.setattr(tv, "machine", dict)
    monkeypatch.setattr(tv, "run_onehop_tail", run_onehop_tail)
    got: Any = tv.validate_tail(tv.TailValidateOptions(), store=None)  # type: ignore[arg-type]
    assert got == "measured" and seen == [-20] and now[0] is None


def test_the_one_hop_access_log_is_off_unless_asked() -> None:
    assert tv.TailValidateOptions().plan().onehop_log is False
    assert tv.TailValidateOptions(onehop_log=True).plan().onehop_log is True
