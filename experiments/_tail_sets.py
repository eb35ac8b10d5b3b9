"""The kept tail sets the tail experiments read (not an experiment itself): ``--set DB ONEHOP
TOPO`` — the set's profile database, its one-hop run directory (whose ``summary.json`` names
the profile) and its topology run directory — repeatable, one per set."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshtax.model.profile import Profile
from meshtax.store.sqlite import ProfileStore


def add_sets(ap: argparse.ArgumentParser) -> None:
    """``--set DB ONEHOP TOPO``, repeatable, at least one."""
    ap.add_argument(
        "--set", nargs=3, action="append", required=True, metavar=("DB", "ONEHOP", "TOPO")
    )


def set_profile(db: str, onehop: str) -> Profile:
    """The profile a set's one-hop run names, from the set's database."""
    summary = json.loads((Path(onehop) / "summary.json").read_text())
    prof = ProfileStore(db).get(summary["profile"])
    assert prof is not None, f"{db}: no profile {summary['profile']}"
    return prof
