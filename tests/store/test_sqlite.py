from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import tests.helpers as hp
from meshtax.model.components import IPC, OTHER
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import Platform
from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import SCHEMA_VERSION, ProfileStore, StoreError, _v1, migrate
from tests.helpers import PLATFORM, profile


def fitted_profile(name: str = "m1"):  # type: ignore[no-untyped-def]
    lat = CostModel.fit([100, 1000, 4000], [10, 19, 50], rates=[100, 100, 100])
    return profile({Mode.HTTP: {OTHER: ComponentModel(lat, lat)}}, name=name)


def test_save_get_list_delete(tmp_path: Path) -> None:
    s = ProfileStore(tmp_path / "p.db")
    p = fitted_profile()
    s.save(p)
    assert s.get("m1") == p
    assert [r.name for r in s.list()] == ["reference", "m1"]
    with pytest.raises(StoreError, match="exists"):
        s.save(p)
    s.save(p, replace=True)
    assert len(s.samples("m1")) == 6  # 3 latency + 3 cpu samples
    s.delete("m1")
    with pytest.raises(StoreError, match="no profile named 'm1'"):
        s.get("m1")


def test_reference_is_bundled_and_protected(tmp_path: Path) -> None:
    s = ProfileStore(tmp_path / "p.db")
    assert s.get("reference").provenance.source == "published"
    with pytest.raises(StoreError, match="reference"):
        s.save(fitted_profile("reference"))


def test_for_host_picks_newest_measured_profile_of_this_host(tmp_path: Path) -> None:
    s = ProfileStore(tmp_path / "p.db")
    s.save(fitted_profile("old"))
    assert s.for_host(PLATFORM).name == "old"  # type: ignore[union-attr]
    assert s.for_host(Platform("Other CPU", 2, "6.0")) is None


def test_migration_from_v1_backfills_samples(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    doc = fitted_profile().to_dict()
    with closing(sqlite3.connect(path)) as db, db:
        _v1(db)
        db.execute("PRAGMA user_version = 1")
        db.execute(
            "INSERT INTO profiles(name, platform_key, source, created, document) VALUES (?,?,?,?,?)",
            ("m1", "k", "measured", "2026-11-22", json.dumps(doc)),
        )
    s = ProfileStore(path)  # migrates on open
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert len(s.samples("m1")) == 6
    assert s.get("m1").name == "m1"


def test_every_migration_step_from_empty(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "x.db")) as db:
        for v in range(1, SCHEMA_VERSION + 1):
            assert migrate(db, v) == v


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        ProfileStore(path)


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_text("this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable profile database"):
        ProfileStore(path)


def _open_at(path: str, barrier: Any) -> None:
    barrier.wait()
    ProfileStore(path)


def test_fresh_database_created_by_many_processes_at_once(tmp_path: Path) -> None:
    # schema and version stamp are one BEGIN IMMEDIATE transaction: no "table already exists"
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    for i in range(15):
        path = str(tmp_path / f"p{i}.db")
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_at, args=(path, barrier)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_stored_profile_that_fails_validation_is_reported_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ProfileStore(tmp_path / "p.db")
    good = hp.profile({Mode.HTTP: {IPC: hp.flat(5.0, 2.0)}}, name="good")
    store.save(good)
    negative = hp.profile({Mode.HTTP: {IPC: hp.flat(-5.0, 2.0)}}, name="negative")
    with pytest.raises(StoreError, match="'negative' fails its checks: .*total latency is -5"):
        store.save(negative)  # what it would refuse to load, the store does not write
    kept = json.loads((tmp_path / "p.negative.refused.json").read_text())  # nor does it lose
    assert kept["name"] == "negative"
    with monkeypatch.context() as m:  # as an older meshtax or another tool wrote them
        m.setattr("meshtax.store.sqlite.profile_problems", lambda p: [])
        store.save(hp.profile({Mode.HTTP: {IPC: hp.flat(float("nan"), 2.0)}}, name="nan"))
        store.save(negative)
    assert [s.name for s in store.list() if not s.bundled] == ["good"]
    assert {n for n, _ in store.unusable} == {"nan", "negative"}
    with pytest.raises(
        StoreError, match="(?s)'nan'.*not usable.*intercept: nan is not a finite number"
    ):
        store.get("nan")
    with pytest.raises(StoreError, match="total latency is -5"):
        store.get("negative")
    assert store.get("good") == good
