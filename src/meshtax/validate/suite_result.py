"""A suite's result: its cases per set, with the profile, machine and options they came from;
the summary per set, the hold-out's issue-#14 targets, the Markdown the suite prints (both sets
apart, the machine's speed per set) and the JSON document ``summary.json`` holds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshtax.validate.result import (
    FAR,
    SATURATED,
    SET_METRICS,
    CaseResult,
    ValidationResult,
    set_summary,
)
from meshtax.validate.suite import SETS

__all__ = ["FORMAT", "TARGETS", "SuiteResult"]

FORMAT = "meshtax-suite/1"
#: issue #14's bar for the hold-out set: median |error| and |bias| at most, share beyond 30 %
TARGETS = {"median_abs_error": 0.15, "bias": 0.10, "beyond_share": 0.10}


@dataclass(frozen=True)
class SuiteResult:
    """A suite's cases per set, with the profile and machine they came from."""

    suite: Mapping[str, Any]
    sets: Mapping[str, tuple[CaseResult, ...]]
    profile: Mapping[str, Any] = field(default_factory=dict)
    machine: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    started: str = ""
    finished: str = ""
    missing: tuple[str, ...] = ()
    loadavg_end: Sequence[float] | None = None
    case_loads: tuple[float, ...] = ()  # 1-min load average after each case
    #: the same cases predicted with the transfer fitted on the calibration set (:func:`calibrate`)
    calibrated: SuiteResult | None = None

    def summary(self) -> dict[str, Any]:
        """:func:`~meshtax.validate.result.set_summary` of each set that has cases."""
        return {s: set_summary(cs) for s, cs in self.sets.items() if cs}

    def targets(self) -> dict[str, dict[str, bool]]:
        """Per metric (latency p50, CPU): does the hold-out set meet :data:`TARGETS`?"""
        s = self.summary().get("holdout")
        if s is None:
            return {}
        return {
            m: {
                "median_abs_error": s[m]["median_abs_error"] <= TARGETS["median_abs_error"],
                "bias": abs(s[m]["mean_error"]) <= TARGETS["bias"],
                "beyond_share": s[m].get("beyond_share", math.nan) <= TARGETS["beyond_share"],
            }
            for m in ("latency", "cpu")
            if s[m]["n"]
        }

    def to_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "suite": dict(self.suite),
            "started": self.started,
            "finished": self.finished,
            "machine": dict(self.machine),
            "loadavg_end": self.loadavg_end,
            "case_loads": list(self.case_loads),
            "profile": dict(self.profile),
            "options": dict(self.options),
            "missing": list(self.missing),
            "summary": self.summary(),
            "targets": self.targets(),
            "sets": {s: [c.to_case() for c in cs] for s, cs in self.sets.items()},
            **({} if self.calibrated is None else {"calibrated": self.calibrated.to_document()}),
        }

    def validation_documents(self) -> list[dict[str, Any]]:
        """One ``meshtax-validation/1`` document per set (what the HTML report reads)."""
        return [
            ValidationResult(
                f"{self.suite.get('name', 'suite')}: {s} set",
                cs,
                str(self.profile.get("name", "")),
                self.machine,
                self.options,
                tuple(self.header()),
            ).to_document()
            for s, cs in self.sets.items()
            if cs
        ]

    def header(self) -> list[str]:
        """Where the numbers come from: machine, date, load, profile and its closure."""
        m, p = self.machine, self.profile
        load = m.get("loadavg")
        end = self.loadavg_end
        lines = [
            f"Machine: {m.get('host', '?')}; {self.started} → {self.finished or 'unfinished'}; "
            f"load average {_load(load)} at the start, {_load(end)} after the last case"
            + (
                f" (1-min after each case: median {statistics.median(self.case_loads):.2f}, "
                f"{min(self.case_loads):.2f}–{max(self.case_loads):.2f})."
                if self.case_loads
                else "."
            ),
            f"Profile `{p.get('name', '?')}` ({p.get('how', '?')}, created "
            f"{p.get('created', '?')}); closure "
            + (
                ", ".join(
                    f"{mode} {c['error']:+.0%} ({'closes' if c['closes'] else 'does NOT close'})"
                    for mode, c in (p.get("closure") or {}).items()
                )
                or "not recorded"
            )
            + ".",
        ]
        lines += [f"Profile note: {w}" for w in p.get("warnings", ())]
        if speed := self.speed_line():
            lines.append(speed)
        if p.get("transfer"):
            lo = p.get("loto")
            lines.append(
                "Fitted to the calibration set only: per cost model (a mode's, or a tcp mode's "
                "model of the protocol it carries), the factor its cases' measured per-message "
                "CPU takes over the profile's, and latency's own where the transfer has it (the "
                "hold-out set is predicted with them)"
                + (
                    f"; leaving out one calibration topology at a time, its cases' CPU error: "
                    f"median abs. {lo['median_abs_error']:.1%}, bias {lo['bias']:+.1%} "
                    f"({lo['cases']} cases)."
                    if lo
                    else "."
                )
            )
        else:
            lines.append(
                "Nothing is fitted to either set: every case is predicted from the profile's "
                "measured costs; the calibration set is the applications the model was "
                "developed on."
            )
        o = self.options
        lines.append(
            f"Runs: {o.get('duration_s', '?')} s each"
            + (" (quick)" if o.get("quick") else "")
            + (
                "; costs scaled to the machine's speed at each case"
                if o.get("speed") == "now"
                else ""
            )
            + f"; rates {o.get('rates', '?')} requests/s; sets {', '.join(self.sets)}."
        )
        if self.missing:
            lines.append(
                f"Not measured (yet): {len(self.missing)} case(s): {', '.join(self.missing)}."
            )
        return lines

    def speeds(self) -> dict[str, list[float]]:
        """Per set, the machine speed its cases read (the reference sidecar's CPU-µs a request,
        in measuring order; cases without one left out)."""
        return {
            s: [c.speed.sidecar_ns / 1e3 for c in cs if c.speed and c.speed.sidecar_ns]
            for s, cs in self.sets.items()
        }

    def speed_line(self) -> str:
        """The machine's speed under each set and at the profile, and the order the sets were
        measured in: a set that read a slower machine than the one the transfer was fitted on
        is predicted low (suite run 11)."""
        per = {s: v for s, v in self.speeds().items() if v}
        if not per:
            return ""
        own = ((self.profile.get("quality") or {}).get("speed") or {}).get("sidecar_ns")
        order = self.options.get("order", "sets")
        return (
            "Machine speed (reference sidecar, CPU-µs a request; median, range): "
            + ", ".join(
                f"{s} {statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"
                for s, v in per.items()
            )
            + (f"; the profile {own / 1e3:.1f}" if own else "")
            + f"; sets measured {'interleaved' if order == 'interleaved' else 'set after set'}."
        )

    def comparison_table(self) -> list[str]:
        """Both sets side by side: per metric the median |error|, the bias, the 90th
        percentile of |error| and the cases beyond 30 %; the hold-out's issue-#14 targets."""
        summ = self.summary()
        names = [s for s in SETS if s in summ]
        heads = [f"{s} ({summ[s]['measured']} of {summ[s]['cases']} cases)" for s in names]
        rows = [
            "| metric | " + " | ".join(heads) + " | hold-out target |",
            "|---|" + "---:|" * len(names) + "---|",
        ]
        label = {"latency": "latency p50", "p90": "latency p90", "cpu": "CPU"}
        tg = self.targets()
        goal = {
            "median_abs_error": f"≤ {TARGETS['median_abs_error']:.0%}",
            "bias": f"±{TARGETS['bias']:.0%}",
            "beyond_share": f"≤ {TARGETS['beyond_share']:.0%} of cases",
        }
        for metric in SET_METRICS:
            st = [summ[s][metric] for s in names]

            def mark(k: str, metric: str = metric) -> str:
                """The target and whether the hold-out meets it (latency p50 and CPU only)."""
                if metric not in ("latency", "cpu"):
                    return ""
                met = tg.get(metric, {})
                return goal[k] + ("" if k not in met else " met" if met[k] else " not met")

            rows += [
                f"| {label[metric]}: median abs. error | "
                + " | ".join(_pct(x["median_abs_error"]) for x in st)
                + f" | {mark('median_abs_error')} |",
                f"| {label[metric]}: bias (mean signed error) | "
                + " | ".join(_pct(x["mean_error"], sign=True) for x in st)
                + f" | {mark('bias')} |",
                f"| {label[metric]}: 90th pct. of abs. error | "
                + " | ".join(_pct(x["p90_abs_error"]) for x in st)
                + " | |",
                f"| {label[metric]}: beyond {FAR:.0%} | "
                + " | ".join(
                    f"{x['beyond']} ({_pct(x['beyond_share'])})" if x["n"] else "-" for x in st
                )
                + f" | {mark('beyond_share')} |",
            ]
        rows.append("| failed | " + " | ".join(str(len(summ[s]["failed"])) for s in names) + " | |")
        rows.append(
            f"| saturated (meshed copy below {SATURATED:.0%} of the rate) | "
            + " | ".join(str(len(summ[s]["saturated"])) for s in names)
            + " | |"
        )
        return rows

    def by_mode_table(self) -> list[str]:
        summ = self.summary()
        rows = [
            "| set | mode | cases | latency p50: median abs. error (bias) | CPU |",
            "|---|---|---:|---:|---:|",
        ]
        for s in (s for s in SETS if s in summ):
            for mode, st in summ[s]["by_mode"].items():
                lat, cpu = st["latency"], st["cpu"]
                rows.append(
                    f"| {s} | {mode} | {lat['n']} | {_pct(lat['median_abs_error'])} "
                    f"({_pct(lat['mean_error'], sign=True)}) | {_pct(cpu['median_abs_error'])} "
                    f"({_pct(cpu['mean_error'], sign=True)}) |"
                )
        return rows

    def markdown(self) -> str:
        """The whole result: header, both sets side by side, per mode, then each set's cases."""
        name = self.suite.get("name", "suite")
        out = [f"# Validation suite `{name}`: calibration set and hold-out set", ""]
        out += self.header() + [""] + self.comparison_table() + [""] + self.by_mode_table()
        for s in SETS:
            cs = self.sets.get(s, ())
            if cs:
                res = ValidationResult(s, cs, str(self.profile.get("name", "")))
                out += ["", f"## {s} set: per case", "", res.table()]
        if self.calibrated is not None:
            out += ["", "# With the transfer fitted on the calibration set", ""]
            out += self.calibrated.markdown().split("\n")[2:]
        return "\n".join(out)


def _pct(x: float, sign: bool = False) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:+.1%}" if sign else f"{x:.1%}"


def _load(x: Sequence[float] | None) -> str:
    return "?" if not x else "/".join(f"{v:.2f}" for v in x)
