"""A validation suite: cases (topology × query × sidecar mode) split into a calibration set and a
hold-out set before anything is measured (``meshtax validate --suite``).

A suite file (``app/suite.yaml`` is the bundled one)::

    name: issue-14
    split: topology            # whole topologies held out (or: case)
    defaults: {modes: [tcp, http, grpc], rate: 100, duration_s: 3}
    calibration:
      - {topology: bookinfo, query: productpage}
      - {topology: online-boutique, query: view_cart, modes: [http, grpc]}
    holdout:
      - {topology: social-network, query: compose, rate: 50}

Each entry gives one case per mode. A topology is a bundled name (``app/topologies``) or a
path relative to the suite file. Anything fitted may see the calibration set only; with
``split: topology`` no topology appears in both sets, so nothing fitted has seen any part of
a hold-out application. :func:`load_suite` checks all of it and reports every problem at once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from meshtax.model.sidecar import Mode
from meshtax.validate import appctl

__all__ = ["DEFAULT_SUITE", "ORDERS", "SETS", "Suite", "SuiteCase", "SuiteError", "load_suite"]

#: the suite ``meshtax validate --suite`` runs when no file is given
DEFAULT_SUITE = appctl.APP_DIR / "suite.yaml"
#: the two sets, in the order they are measured
SETS = ("calibration", "holdout")
SPLITS = ("topology", "case")
#: the orders a suite's sets may be measured in: "interleaved" spreads each set evenly over the
#: sitting, so a machine that drifts during it (suite run 11: the hold-out, measured after the
#: calibration set, read a 7 % slower machine) drifts under both sets alike; "sets": one set
#: after the other (suite runs 1–11)
ORDERS = ("interleaved", "sets")

_TOP = {"name", "description", "split", "defaults", *SETS}
_DEFAULTS = {"modes", "rate", "duration_s"}
_ENTRY = {"topology", "query", "modes", "rate"}


class SuiteError(ValueError):
    """A suite file that cannot be run as written (every problem in one message)."""


@dataclass(frozen=True)
class SuiteCase:
    """One case of a suite: ``query`` of ``topology`` (its ``name:``) under sidecar ``mode``,
    driven at ``rate`` requests/s, in set ``set``."""

    set: str
    topology: str
    query: str
    mode: Mode
    rate: float

    @property
    def key(self) -> str:
        return f"{self.topology}/{self.query}/{self.mode.value}"

    @property
    def stem(self) -> str:
        """File name stem of the case's documents (the validation's trace naming)."""
        return f"{self.topology}-{self.query}-{self.mode.value}"


@dataclass(frozen=True)
class Suite:
    """A checked suite: its cases in file order, calibration set first, the topologies, and the
    default rate (requests/s) and seconds per run."""

    name: str
    path: Path
    split: str
    rate: float
    duration_s: float
    cases: tuple[SuiteCase, ...]
    topologies: Mapping[str, appctl.Topology]

    def of(self, which: str) -> tuple[SuiteCase, ...]:
        """The cases of one set."""
        if which not in SETS:
            raise SuiteError(f"no set {which!r} (sets: {', '.join(SETS)})")
        return tuple(c for c in self.cases if c.set == which)

    def in_order(
        self, sets: tuple[str, ...] = SETS, order: str = "interleaved"
    ) -> tuple[SuiteCase, ...]:
        """The cases of ``sets`` in the order they are measured: set after set, or interleaved —
        each set's cases in file order, placed at even fractions of the sitting ((i + ½) / n for
        the i-th of a set's n cases; ties: the first set first)."""
        if order not in ORDERS:
            raise SuiteError(f"no order {order!r} (orders: {', '.join(ORDERS)})")
        per = [self.of(s) for s in sets]
        if order == "sets":
            return tuple(c for cs in per for c in cs)
        placed = [((i + 0.5) / len(cs), k, c) for k, cs in enumerate(per) for i, c in enumerate(cs)]
        return tuple(c for *_, c in sorted(placed, key=lambda t: (t[0], t[1])))

    def topology_names(self, which: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.topology for c in self.of(which)))

    def describe(self) -> dict[str, Any]:
        """What a result document records about the suite it ran."""
        return {
            "name": self.name,
            "path": str(self.path),
            "split": self.split,
            "rate": self.rate,
            "duration_s": self.duration_s,
            "sets": {
                s: {"topologies": list(self.topology_names(s)), "cases": len(self.of(s))}
                for s in SETS
            },
        }


def _modes(v: Any, where: str, bad: list[str]) -> tuple[Mode, ...]:
    try:
        modes = tuple(Mode(m) for m in (v if isinstance(v, list) else [v]))
    except ValueError:
        bad.append(f"{where}: {v!r} is not a list of modes (tcp, http, grpc)")
        return ()
    if not modes:
        bad.append(f"{where}: no modes")
    return modes


def _rate(v: Any, where: str, bad: list[str]) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        bad.append(f"{where}: {v!r} is not a rate (requests/s ≥ 0; 0: closed loop)")
        return 0.0
    return float(v)


def _topology(ref: str, base: Path, cache: dict[str, appctl.Topology]) -> appctl.Topology:
    local = base / ref
    key = str(local) if local.suffix in (".yaml", ".yml") and local.is_file() else ref
    if key not in cache:
        cache[key] = appctl.load_topology(key)
    return cache[key]


def load_suite(path: str | os.PathLike[str] | None = None) -> Suite:
    """Read and check a suite file (default: :data:`DEFAULT_SUITE`): known fields only, every
    topology and query exists, modes and rates are valid, no case twice, the sets disjoint
    (and, with ``split: topology``, no topology in both), neither set empty."""
    p = Path(path) if path is not None else DEFAULT_SUITE
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SuiteError(f"{p}: cannot read the suite ({e})") from None
    if not isinstance(doc, dict):
        raise SuiteError(f"{p}: expected a mapping with {', '.join(SETS)}")
    bad: list[str] = [f"{k}: unknown field" for k in doc if k not in _TOP]
    split = doc.get("split", "topology")
    if split not in SPLITS:
        bad.append(f"split: {split!r} is not one of {', '.join(SPLITS)}")
    d = doc.get("defaults") or {}
    if not isinstance(d, dict):
        d = {}
        bad.append("defaults: expected a mapping")
    bad += [f"defaults.{k}: unknown field" for k in d if k not in _DEFAULTS]
    modes = _modes(d.get("modes", [m.value for m in Mode]), "defaults.modes", bad)
    rate = _rate(d.get("rate", 100.0), "defaults.rate", bad)
    duration = d.get("duration_s", 3.0)
    if not isinstance(duration, int | float) or isinstance(duration, bool) or duration <= 0:
        bad.append(f"defaults.duration_s: {duration!r} is not a positive number of seconds")
        duration = 3.0
    cache: dict[str, appctl.Topology] = {}
    cases: list[SuiteCase] = []
    for which in SETS:
        entries = doc.get(which)
        if not isinstance(entries, list) or not entries:
            bad.append(f"{which}: expected a non-empty list of cases")
            continue
        for i, ent in enumerate(entries):
            where = f"{which}[{i}]"
            if not isinstance(ent, dict):
                bad.append(f"{where}: expected a mapping with topology and query")
                continue
            bad += [f"{where}.{k}: unknown field" for k in ent if k not in _ENTRY]
            if not ent.get("topology"):
                bad.append(f"{where}: no topology")
                continue
            try:
                topo = _topology(str(ent.get("topology", "")), p.parent, cache)
                q = topo.query(str(ent["query"])) if "query" in ent else None
            except appctl.AppError as err:
                bad.append(f"{where}: {err}")
                continue
            if q is None:
                bad.append(f"{where}: no query")
                continue
            r = _rate(ent["rate"], f"{where}.rate", bad) if "rate" in ent else rate
            ms = _modes(ent["modes"], f"{where}.modes", bad) if "modes" in ent else modes
            cases += [SuiteCase(which, topo.name, q.name, m, r) for m in ms]
    seen: dict[str, str] = {}
    for c in cases:
        if c.key in seen:
            bad.append(
                f"case {c.key} twice in {c.set}"
                if seen[c.key] == c.set
                else f"case {c.key} in both sets"
            )
        seen.setdefault(c.key, c.set)
    paths: dict[str, Path] = {}
    for t in cache.values():
        if paths.setdefault(t.name, t.path) != t.path:
            bad.append(f"two topologies named {t.name!r}: {paths[t.name]}, {t.path}")
    if split == "topology":
        cal = {c.topology for c in cases if c.set == "calibration"}
        shared = sorted(cal & {c.topology for c in cases if c.set == "holdout"})
        if shared:
            bad.append(
                f"split: topology, but {', '.join(shared)} in both sets (hold out whole "
                "topologies, or say split: case)"
            )
    if bad:
        raise SuiteError(f"{p}: " + "; ".join(bad))
    topologies = {t.name: t for t in cache.values()}
    name = str(doc.get("name", p.stem))
    return Suite(name, p, split, rate, float(duration), tuple(cases), topologies)
