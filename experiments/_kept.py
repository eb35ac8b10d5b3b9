"""The command line every experiment over a kept validation shares (not an experiment itself):
the validation's documents, the profile database and the sidecar profile the validation used,
and the pod CPUs it ran with."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshtax.app.pricing import role_profiles
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Architecture
from meshtax.store.sqlite import ProfileStore


def kept_validation_parser(
    doc: str | None, *, many: bool = True, doc_help: str | None = None
) -> argparse.ArgumentParser:
    """``--doc`` (one, or with ``many`` several), ``--db``, ``--profile``, ``--pod-cpus``;
    described by the first line of the experiment's ``doc``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--doc", required=True, nargs="+" if many else None, help=doc_help)
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", required=True, help="the sidecar profile the validation used")
    ap.add_argument("--pod-cpus", type=int, default=1)
    return ap


def error_line(label: str, errors: Sequence[float]) -> str:
    """``label: median abs error …% (mean signed …%)`` of signed relative errors."""
    med = statistics.median(abs(e) for e in errors)
    return f"{label}: median abs error {med:.1%} (mean signed {statistics.fmean(errors):+.1%})"


def kept_validation(
    store: ProfileStore, path: str, archs: Sequence[Architecture]
) -> tuple[dict[str, Any], Architecture, dict[Architecture, Profile]]:
    """A kept validation's document at ``path``, its architecture (one of ``archs``, else the
    experiment exits saying so) and the store's role profiles for it, as the validation took
    them (the newest of each role, unclosed ones too)."""
    doc = json.loads(Path(path).read_text())
    arch = Architecture(doc["options"]["architecture"])
    if arch not in archs:
        want = " or ".join(a.value for a in archs)
        raise SystemExit(f"{path}: a {arch.value} validation; give a {want} one")
    got, _ = role_profiles(store, (arch,), accept_unclosed=True)
    return doc, arch, {r: store.get(n) for r, n in got.items()}
