"""The profile database: SQLite, created on first use, versioned with ``PRAGMA user_version``.

Schema history (every step is a migration, tested from each earlier version):
  1 — 2026-11-22: ``profiles`` (one JSON document per profile, indexed by name and platform key).
  2 — 2026-11-22: ``samples`` (the raw samples behind every fitted model, one row each, so
      they can be queried without decoding documents); backfilled from existing documents.
"""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from meshtax.model.profile import Platform, Profile
from meshtax.store.reference import REFERENCE_NAME, reference_profile

SCHEMA_VERSION = 2


class StoreError(RuntimeError):
    pass


def default_path() -> Path:
    """``$MESHTAX_DB``, else ``<user data dir>/meshtax/profiles.db``."""
    env = os.environ.get("MESHTAX_DB")
    if env:
        return Path(env)
    return Path(platformdirs.user_data_dir("meshtax")) / "profiles.db"


def _v1(db: sqlite3.Connection) -> None:
    db.executescript(
        """
        CREATE TABLE profiles (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            platform_key TEXT NOT NULL,
            source TEXT NOT NULL,
            created TEXT NOT NULL,
            document TEXT NOT NULL
        );
        CREATE INDEX profiles_platform ON profiles(platform_key);
        """
    )


def _sample_rows(profile_id: int, doc: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    for mode, mp in doc["modes"].items():
        for comp, cm in mp["components"].items():
            for metric in ("latency", "cpu"):
                s = cm[metric].get("samples")
                if not s:
                    continue
                rates = s.get("rates") or [None] * len(s["sizes"])
                for size, value, rate in zip(s["sizes"], s["values"], rates):
                    yield (profile_id, mode, comp, metric, size, rate, value)


def _v2(db: sqlite3.Connection) -> None:
    db.executescript(
        """
        CREATE TABLE samples (
            profile_id INTEGER NOT NULL REFERENCES profiles(id) ON DELETE CASCADE,
            mode TEXT NOT NULL,
            component TEXT NOT NULL,
            metric TEXT NOT NULL,
            size REAL NOT NULL,
            rate REAL,
            value REAL NOT NULL
        );
        CREATE INDEX samples_profile ON samples(profile_id, mode, component);
        """
    )
    for pid, doc in db.execute("SELECT id, document FROM profiles").fetchall():
        db.executemany(
            "INSERT INTO samples VALUES (?,?,?,?,?,?,?)", _sample_rows(pid, json.loads(doc))
        )


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_v1, _v2)


def migrate(db: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring ``db`` to ``target``, one transaction per step; returns the version reached."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"profile database schema {version} is newer than this meshtax ({SCHEMA_VERSION}); upgrade meshtax"
        )
    while version < target:
        with db:
            MIGRATIONS[version](db)
            version += 1
            db.execute(f"PRAGMA user_version = {version}")
    return version


@dataclass(frozen=True)
class ProfileSummary:
    name: str
    platform: Platform
    source: str
    created: str
    modes: tuple[str, ...]
    filters: tuple[str, ...]
    bundled: bool = False


class ProfileStore:
    """Profiles by name. The bundled reference profile is always there (read-only)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with closing(self._connect()) as db:
                migrate(db)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a usable profile database ({e})") from None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path)
        db.execute("PRAGMA foreign_keys = ON")
        return db

    def save(self, profile: Profile, *, replace: bool = False) -> None:
        if profile.name == REFERENCE_NAME:
            raise StoreError(
                f"{REFERENCE_NAME!r} is the bundled reference profile's name; choose another"
            )
        doc = profile.to_dict()
        with closing(self._connect()) as db, db:
            row = db.execute("SELECT id FROM profiles WHERE name = ?", (profile.name,)).fetchone()
            if row and not replace:
                raise StoreError(
                    f"a profile named {profile.name!r} exists; pass replace=True (CLI: --replace) "
                    "or choose another name"
                )
            if row:
                db.execute("DELETE FROM profiles WHERE id = ?", (row[0],))
            cur = db.execute(
                "INSERT INTO profiles(name, platform_key, source, created, document) VALUES (?,?,?,?,?)",
                (
                    profile.name,
                    profile.platform.key,
                    profile.provenance.source,
                    profile.provenance.created,
                    json.dumps(doc),
                ),
            )
            assert cur.lastrowid is not None
            db.executemany(
                "INSERT INTO samples VALUES (?,?,?,?,?,?,?)", _sample_rows(cur.lastrowid, doc)
            )

    def get(self, name: str) -> Profile:
        if name == REFERENCE_NAME:
            return reference_profile()
        with closing(self._connect()) as db:
            row = db.execute("SELECT document FROM profiles WHERE name = ?", (name,)).fetchone()
        if row is None:
            have = ", ".join(s.name for s in self.list())
            raise StoreError(f"no profile named {name!r} in {self.path} (have: {have})")
        return Profile.from_dict(json.loads(row[0]))

    def delete(self, name: str) -> None:
        with closing(self._connect()) as db, db:
            if db.execute("DELETE FROM profiles WHERE name = ?", (name,)).rowcount == 0:
                raise StoreError(f"no profile named {name!r}")

    def list(self) -> list[ProfileSummary]:
        ref = reference_profile()
        out = [_summary(ref, bundled=True)]
        with closing(self._connect()) as db:
            for (doc,) in db.execute("SELECT document FROM profiles ORDER BY created, name"):
                out.append(_summary(Profile.from_dict(json.loads(doc))))
        return out

    def for_host(self, host: Platform) -> Profile | None:
        """The newest measured profile of this host (same CPU model, cores, kernel); one of
        the host's proxy without a variant when there is one (profiles of the reference
        sidecar or of a Unix-socket variant are for what-if comparisons, not the default)."""
        best: Profile | None = None
        plain: Profile | None = None
        with closing(self._connect()) as db:
            for (doc,) in db.execute(
                "SELECT document FROM profiles WHERE source = 'measured' ORDER BY created"
            ):
                p = Profile.from_dict(json.loads(doc))
                if p.platform.same_host(host):
                    best = p
                    if p.platform.proxy == host.proxy and not p.platform.variant:
                        plain = p
        return plain or best

    def samples(self, name: str) -> builtins.list[tuple[str, str, str, float, float | None, float]]:
        """Raw samples of a stored profile: (mode, component, metric, size, rate, value)."""
        with closing(self._connect()) as db:
            return db.execute(
                "SELECT s.mode, s.component, s.metric, s.size, s.rate, s.value FROM samples s "
                "JOIN profiles p ON p.id = s.profile_id WHERE p.name = ? ORDER BY 1,2,3,4",
                (name,),
            ).fetchall()


def _summary(p: Profile, bundled: bool = False) -> ProfileSummary:
    filters = sorted({f for mp in p.modes.values() for f in mp.filters()})
    return ProfileSummary(
        p.name,
        p.platform,
        p.provenance.source,
        p.provenance.created,
        tuple(m.value for m in p.modes),
        tuple(filters),
        bundled,
    )
