"""The command line every experiment over a kept validation shares (not an experiment itself):
the validation's documents, the profile database and the sidecar profile the validation used,
and the pod CPUs it ran with."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence


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
