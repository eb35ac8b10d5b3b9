"""What an import kept and dropped, and why (every drop is counted; nothing is dropped silently)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ImportReport:
    """Counts of one import. ``dropped_rows``/``dropped_graphs`` map a reason to a count;
    ``notes`` counts repairs that kept the data (e.g. a caller taken from the parent)."""

    source: str
    format: str
    rows_read: int = 0
    rows_used: int = 0
    rows_merged: int = 0  # duplicate log lines of one call merged into one invocation
    graphs_seen: int = 0
    graphs_kept: int = 0
    graphs_partial: int = 0  # kept, but some of their rows were dropped
    dropped_rows: Counter[str] = field(default_factory=Counter)
    dropped_graphs: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)

    @property
    def graphs_dropped(self) -> int:
        return sum(self.dropped_graphs.values())

    def add(self, other: ImportReport) -> None:
        """Accumulate the counts of ``other`` (e.g. of another chunk or file)."""
        self.rows_read += other.rows_read
        self.rows_used += other.rows_used
        self.rows_merged += other.rows_merged
        self.graphs_seen += other.graphs_seen
        self.graphs_kept += other.graphs_kept
        self.graphs_partial += other.graphs_partial
        self.dropped_rows.update(other.dropped_rows)
        self.dropped_graphs.update(other.dropped_graphs)
        self.notes.update(other.notes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": self.format,
            "rows_read": self.rows_read,
            "rows_used": self.rows_used,
            "rows_merged": self.rows_merged,
            "graphs_seen": self.graphs_seen,
            "graphs_kept": self.graphs_kept,
            "graphs_partial": self.graphs_partial,
            "graphs_dropped": self.graphs_dropped,
            "dropped_rows": dict(sorted(self.dropped_rows.items())),
            "dropped_graphs": dict(sorted(self.dropped_graphs.items())),
            "notes": dict(sorted(self.notes.items())),
        }

    def summary(self) -> str:
        """A few human lines: kept/dropped and the reasons."""
        lines = [
            f"{self.source} ({self.format}): {self.rows_read} rows read, {self.rows_used} used, "
            f"{self.rows_merged} duplicate lines merged",
            f"graphs: {self.graphs_seen} seen, {self.graphs_kept} kept ({self.graphs_partial} "
            f"partially), {self.graphs_dropped} dropped",
        ]
        for title, c in (
            ("dropped graphs", self.dropped_graphs),
            ("dropped rows", self.dropped_rows),
            ("repairs", self.notes),
        ):
            for reason, n in sorted(c.items(), key=lambda kv: -kv[1]):
                lines.append(f"  {title}: {n} × {reason}")
        return "\n".join(lines)
