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

from meshtax import safeio
from meshtax.errors import MeshtaxError
from meshtax.errors import StoreError as StoreError
from meshtax.model.profile import Platform, Profile
from meshtax.model.profile_check import profile_problems
from meshtax.store.reference import REFERENCE_NAME, reference_profile

SCHEMA_VERSION = 2


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
    """Bring ``db`` to ``target`` in one ``BEGIN IMMEDIATE`` transaction: the version is read
    under the write lock, so two processes creating or upgrading one database never both run
    a step (the second waits, then finds the work done). Returns the version reached."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"profile database schema {version} is newer than this meshtax ({SCHEMA_VERSION}); "
            "upgrade meshtax"
        )
    if version >= target:
        return version
    db.isolation_level = None  # transactions by hand: executescript must not commit midway
    db.execute("BEGIN IMMEDIATE")
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])  # under the lock
        while version < target:
            _run_step(db, MIGRATIONS[version])
            version += 1
            db.execute(f"PRAGMA user_version = {version}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return version


def _run_step(db: sqlite3.Connection, step: Callable[[sqlite3.Connection], None]) -> None:
    """A migration step inside the caller's transaction (``executescript`` would commit it)."""

    class _InTx:
        def __init__(self, inner: sqlite3.Connection) -> None:
            self._db = inner

        def executescript(self, script: str) -> None:
            for stmt in _statements(script):
                self._db.execute(stmt)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._db, name)

    step(_InTx(db))  # type: ignore[arg-type]


def _statements(script: str) -> list[str]:
    out, cur = [], ""
    for line in script.splitlines(keepends=True):
        cur += line
        if sqlite3.complete_statement(cur):
            out.append(cur.strip())
            cur = ""
    return [s for s in out if s]


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
        #: stored profiles that failed validation when read: (name, why); never used
        self.unusable: builtins.list[tuple[str, str]] = []
        if self.path.exists() and not self.path.is_file():
            raise StoreError(f"{self.path}: not a regular file; expected a profile database")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as db:
                migrate(db)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a usable profile database ({e})") from None
        except OSError as e:
            raise StoreError(f"{self.path}: cannot open the profile database ({e})") from None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30.0)
        db.execute("PRAGMA foreign_keys = ON")
        return db

    def _load(self, name: str, document: str) -> Profile | str:
        """A stored document as a validated profile, or why not (also noted in ``unusable``)."""
        try:
            doc = safeio.parse_json(document, name, nonfinite=True)
            return Profile.from_dict(doc, source=name)
        except MeshtaxError as e:
            why = str(e).removeprefix(f"{name}: ")
            if (name, why) not in self.unusable:
                self.unusable.append((name, why))
            return why

    def save(self, profile: Profile, *, replace: bool = False) -> None:
        if profile.name == REFERENCE_NAME:
            raise StoreError(
                f"{REFERENCE_NAME!r} is the bundled reference profile's name; choose another"
            )
        doc = profile.to_dict()
        bad = profile_problems(profile)
        if bad:  # what the store would refuse to load, it does not store; the measurement is kept
            kept = Path(self.path).with_name(f"{Path(self.path).stem}.{profile.name}.refused.json")
            kept.write_text(json.dumps(doc, indent=1))
            raise StoreError(
                f"profile {profile.name!r} fails its checks: "
                + "; ".join(bad[:5])
                + f" (not stored; its document is kept in {kept})"
            )
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
        p = self._load(name, row[0])
        if isinstance(p, str):
            raise StoreError(
                f"stored profile {name!r} in {self.path} is not usable: {p}"
                " (delete it with `meshtax profiles delete`, or re-import a good export)"
            )
        return p

    def delete(self, name: str) -> None:
        with closing(self._connect()) as db, db:
            if db.execute("DELETE FROM profiles WHERE name = ?", (name,)).rowcount == 0:
                raise StoreError(f"no profile named {name!r}")

    def list(self) -> list[ProfileSummary]:
        ref = reference_profile()
        out = [_summary(ref, bundled=True)]
        with closing(self._connect()) as db:
            rows = db.execute("SELECT name, document FROM profiles ORDER BY created, name")
            for name, doc in rows.fetchall():
                p = self._load(name, doc)
                if not isinstance(p, str):
                    out.append(_summary(p))
        return out

    def for_host(self, host: Platform, architecture: str = "") -> Profile | None:
        """The newest measured profile of this host (same CPU model, cores, kernel); one of
        the host's proxy without a variant when there is one (profiles of the reference
        sidecar or of a Unix-socket variant are for what-if comparisons, not the default).
        ``architecture``: the newest profile of a proxy in that role instead (node-l4,
        waypoint); sidecar profiles are never those."""
        best: Profile | None = None
        plain: Profile | None = None
        with closing(self._connect()) as db:
            for name, doc in db.execute(
                "SELECT name, document FROM profiles WHERE source = 'measured' ORDER BY created"
            ).fetchall():
                p = self._load(name, doc)
                if isinstance(p, str) or not p.platform.same_host(host):
                    continue
                if p.platform.architecture != architecture:
                    continue
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
