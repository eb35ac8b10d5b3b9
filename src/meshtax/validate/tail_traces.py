"""A topology's no-mesh traces in a tail validation (:mod:`meshtax.validate.tail_run`): one
load level's traces out of a run's, and how late the load generator's requests reached the
entry service (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["arrival_lag_us", "traces_within"]


def arrival_lag_us(doc: Mapping[str, Any], rate: float) -> float | None:
    """How late a paced load generator's requests reached the entry service, from no-mesh
    traces (OTLP/JSON) of a level at ``rate``: the mean of an exponential lag behind an even
    schedule. The entry's server spans (those without a parent in the document) are sampled
    every k-th request (k from their median spacing); the difference of two lags is Laplace,
    whose median absolute deviation is lag × ln 2. It includes the entry's own wait for the
    CPU without the mesh (an upper bound on the client's lateness). None: fewer than 20
    spacings.

    Measured on set 2's Bookinfo (25/50/75 %): ~600–670 µs; set 1: ~830–1 080 µs — absolute,
    not a share of the spacing: at Bookinfo's 1.8–5.4 ms arrivals are nearly even, at one
    hop's 60–220 µs as good as Poisson."""
    spans: list[Mapping[str, Any]] = []
    for rs in doc.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            spans += ss.get("spans") or []
    ids = {str(sp.get("spanId")) for sp in spans}
    t = np.sort(
        np.array(
            [
                int(sp.get("startTimeUnixNano", 0))
                for sp in spans
                if not sp.get("parentSpanId") or str(sp.get("parentSpanId")) not in ids
            ],
            dtype=np.float64,
        )
        * 1e-3
    )
    if t.size < 21 or rate <= 0:
        return None
    a = 1e6 / rate
    d = np.diff(t) / a
    k = max(1, int(round(float(np.median(d)))))
    dev = (d[(d > k - 3) & (d < k + 3)] - k) * a
    if dev.size < 20:
        return None
    mad = float(np.median(np.abs(dev - np.median(dev))))
    return mad / math.log(2)


def traces_within(doc: Mapping[str, Any], windows: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """The traces of an OTLP/JSON document whose first span started within one of
    ``windows`` (Unix seconds): one load level's requests out of a run's traces."""
    first: dict[str, int] = {}
    for rs in doc.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            for sp in ss.get("spans") or []:
                t = int(sp.get("startTimeUnixNano", 0))
                tid = str(sp.get("traceId"))
                first[tid] = min(first.get(tid, t), t)
    keep = {tid for tid, t in first.items() if any(lo * 1e9 <= t <= hi * 1e9 for lo, hi in windows)}
    out = []
    for rs in doc.get("resourceSpans") or []:
        scopes = []
        for ss in rs.get("scopeSpans") or []:
            spans = [sp for sp in ss.get("spans") or [] if str(sp.get("traceId")) in keep]
            if spans:
                scopes.append({**ss, "spans": spans})
        if scopes:
            out.append({**rs, "scopeSpans": scopes})
    return {"resourceSpans": out}
