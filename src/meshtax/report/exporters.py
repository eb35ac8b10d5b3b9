"""One exporter per format behind one small interface: ``write(document, out)`` writes it
to a text stream, ``export(document) -> str`` returns the text.

Documents are the plain dicts of :mod:`meshtax.report.result` (predictions) and profile
documents (``Profile.to_dict``); exporters never see internal objects. JSON and CSV write a
prediction graph by graph: the text of 200 000 graphs is never held whole.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from typing import Any, Protocol, TextIO

from meshtax.report.markdown import MarkdownExporter
from meshtax.report.result import GraphList


class Exporter(Protocol):
    suffix: str

    def write(self, doc: Mapping[str, Any], out: TextIO) -> None: ...

    def export(self, doc: Mapping[str, Any]) -> str: ...


class _Streamed:
    """``export`` as ``write`` to a string."""

    def write(self, doc: Mapping[str, Any], out: TextIO) -> None:
        raise NotImplementedError

    def export(self, doc: Mapping[str, Any]) -> str:
        buf = io.StringIO()
        self.write(doc, buf)
        return buf.getvalue()


def _clean(x: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


class JsonExporter(_Streamed):
    suffix = ".json"

    def write(self, doc: Mapping[str, Any], out: TextIO) -> None:
        graphs = doc.get("graphs")
        if not isinstance(graphs, GraphList):
            out.write(json.dumps(_clean(doc), indent=2, sort_keys=False) + "\n")
            return
        # graph by graph: the text of one graph at a time, not of every graph at once
        head = json.dumps(_clean({**doc, "graphs": [0]}), indent=2, sort_keys=False)
        where = '"graphs": [\n    0\n  ]'
        assert head.count(where) == 1
        before, after = head.split(where)
        out.write(before + '"graphs": [\n    ')
        for i, g in enumerate(graphs):
            if i:
                out.write(",\n    ")
            out.write(json.dumps(_clean(g), indent=2).replace("\n", "\n    "))
        out.write("\n  ]" + after + "\n")


def _fmt(v: Any) -> Any:
    """Floats to 6 significant digits: stable golden files, no false precision."""
    return f"{v:.6g}" if isinstance(v, float) else ("" if v is None else v)


class CsvExporter(_Streamed):
    """Predictions: one row per graph. Profiles: one row per mode and component."""

    suffix = ".csv"

    def write(self, doc: Mapping[str, Any], out: TextIO) -> None:
        rows = csv.writer(out, lineterminator="\n")

        def write(row: list[Any]) -> None:
            rows.writerow([_fmt(v) for v in row])

        if "graphs" in doc:
            comps = list(doc["components"])
            write(
                [
                    "graph",
                    "base_latency_us",
                    "latency_overhead_us",
                    "latency_lo_us",
                    "latency_hi_us",
                    "latency_overhead_pct",
                    "cpu_vcpu",
                    "cpu_lo_vcpu",
                    "cpu_hi_vcpu",
                    "absorbed_us",
                ]
                + [f"latency_us:{c}" for c in comps]
                + [f"cpu_vcpu:{c}" for c in comps]
            )
            for g in doc["graphs"]:
                lat, cpu = g["latency_overhead_us"], g["cpu_vcpu"]
                write(
                    [
                        g["name"],
                        g["base_latency_us"],
                        lat["value"],
                        lat["lo"],
                        lat["hi"],
                        g["latency_overhead_pct"],
                        cpu["value"],
                        cpu["lo"],
                        cpu["hi"],
                        g["absorbed_us"],
                    ]
                    + [g["latency_by_component_us"][c] for c in comps]
                    + [g["cpu_by_component_vcpu"][c] for c in comps]
                )
        else:
            write(
                [
                    "profile",
                    "mode",
                    "component",
                    "metric",
                    "intercept",
                    "slope_per_byte",
                    "split_bytes",
                    "per_unit",
                    "r2",
                    "n",
                    "note",
                ]
            )
            for mode, mp in doc["modes"].items():
                for comp, cm in mp["components"].items():
                    for metric in ("latency", "cpu"):
                        m = cm[metric]
                        st = m.get("stats") or {}
                        write(
                            [
                                doc["name"],
                                mode,
                                comp,
                                metric,
                                m["intercept"],
                                m["slope"],
                                m["split_bytes"],
                                m["per_unit"],
                                st.get("r2"),
                                st.get("n"),
                                m.get("note", ""),
                            ]
                        )


class HtmlExporter:
    """The full report of one document (a prediction or a profile) as one self-contained page."""

    suffix = ".html"

    def write(self, doc: Mapping[str, Any], out: TextIO) -> None:
        out.write(self.export(doc))

    def export(self, doc: Mapping[str, Any]) -> str:
        # matplotlib loads only when HTML is asked for
        from meshtax.report.build import render_report

        if "graphs" in doc:
            return render_report([doc], []).html
        if "modes" in doc:
            return render_report([], [doc]).html
        raise ValueError("not a prediction or profile document (no 'graphs' or 'modes')")


EXPORTERS: dict[str, Exporter] = {
    "json": JsonExporter(),
    "csv": CsvExporter(),
    "markdown": MarkdownExporter(),
    "html": HtmlExporter(),
}
