"""The report's latency-vs-load figures: a prediction's overhead percentiles against the
request rate with the knee marked (``tail_sweep``), and a tail validation's measured vs
predicted percentiles at each load level (``tail``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import matplotlib
import numpy as np

from meshtax.report.figures import RC, SERIES, Chart, make_chart, new_figure, slug

__all__ = ["load_chart", "tail_validation_chart"]


def _finite(xs: list[float | None]) -> np.ndarray[Any, Any]:
    return np.array([np.nan if x is None or not math.isfinite(x) else x for x in xs], dtype=float)


def load_chart(label: str, doc: Mapping[str, Any]) -> Chart | None:
    """Overhead at each percentile against the request rate, intervals shaded; the knee (the
    first sidecar at the utilisation threshold) dashed, its saturation dotted."""
    s = doc.get("tail_sweep")
    if not s or not s.get("rates"):
        return None
    rates = np.asarray(s["rates"], dtype=float)
    knee = s["knee"]
    with matplotlib.rc_context(RC):
        fig, (ax,) = new_figure(6.4, 3.6)
        for i, p in enumerate(s["overhead_us"]):
            c = SERIES[i % len(SERIES)]
            y = _finite(s["overhead_us"][p])
            ax.plot(rates, y, marker="o", ms=3, color=c, label=p)
            ax.fill_between(
                rates, _finite(s["lo_us"][p]), _finite(s["hi_us"][p]), color=c, alpha=0.15
            )
        for x, style, text in (
            (knee.get("rate"), "--", f"ρ = {knee.get('threshold')}"),
            (knee.get("saturation_rate"), ":", "ρ = 1"),
        ):
            if x is not None and math.isfinite(x) and x <= rates.max() * 1.05:
                ax.axvline(x, color="#555555", linestyle=style, linewidth=1)
                ax.annotate(
                    text,
                    (x, 1.0),
                    xycoords=("data", "axes fraction"),
                    fontsize=7,
                    ha="right",
                    va="top",
                    rotation=90,
                )
        ax.set_xlabel("requests/s")
        ax.set_ylabel("latency overhead (µs)")
        ax.set_yscale("log")
        ax.legend(fontsize=7, loc="upper left")
    who = knee.get("station") or "no sidecar"
    return make_chart(
        fig,
        f"load-{slug(label)}",
        "load",
        f"Latency overhead against load — {label}",
        f"Predicted overhead at each percentile (pooled over the call graphs) as every call's rate "
        f"grows, 95 % intervals shaded. Dashed: {who} reaches the utilisation threshold (the "
        "knee); dotted: it saturates (ρ = 1), beyond which its queue grows without bound.",
    )


def tail_validation_chart(doc: Mapping[str, Any]) -> Chart | None:
    """Per load level: measured overhead percentiles (median over pairs, interval) and the
    prediction (interval as error bars), one panel per percentile."""
    t = doc.get("tail")
    if not t or not t.get("points"):
        return None
    pts = [q for q in t["points"] if q.get("predicted") and q.get("measured")]
    if not pts:
        return None
    ps = list(t["percentiles"])
    x = np.array([q["rate"] for q in pts], dtype=float)
    name = str(doc.get("name", "tail"))
    with matplotlib.rc_context(RC):
        fig, axs = new_figure(3.0 * len(ps) + 0.6, 3.3, 1, len(ps))
        for ax, p in zip(axs, ps):
            m = [q["measured"][p] for q in pts]
            pr = [q["predicted"]["overhead_us"][p] for q in pts]
            med = _finite([v["median"] for v in m])
            ax.errorbar(
                x,
                med,
                yerr=[
                    np.maximum(med - _finite([v["lo"] for v in m]), 0),
                    np.maximum(_finite([v["hi"] for v in m]) - med, 0),
                ],
                marker="o",
                capsize=3,
                color=SERIES[0],
                label="measured",
            )
            val = _finite([v["value"] for v in pr])
            ax.errorbar(
                x * 1.01,
                val,
                yerr=[
                    np.maximum(val - _finite([v["lo"] for v in pr]), 0),
                    np.maximum(_finite([v["hi"] for v in pr]) - val, 0),
                ],
                marker="s",
                capsize=3,
                color=SERIES[1],
                label="predicted",
            )
            for xi, v in zip(x, pr):
                if v["value"] is None or not math.isfinite(v["value"]):
                    ax.annotate(
                        "saturated",
                        (xi, 0.95),
                        xycoords=("data", "axes fraction"),
                        fontsize=6,
                        ha="center",
                        color=SERIES[1],
                    )
            ax.set_title(p, fontsize=9)
            ax.set_xlabel("requests/s")
        axs[0].set_ylabel("latency overhead (µs)")
        axs[0].legend(fontsize=7, loc="upper left")
    return make_chart(
        fig,
        f"tail-validation-{slug(name)}",
        "load",
        f"Tail latency under load, measured vs predicted — {name}",
        "Overhead at each percentile (mesh − no mesh, client side) at each load level: the "
        "median over paired runs with its 95 % interval, and the prediction with its interval.",
    )
