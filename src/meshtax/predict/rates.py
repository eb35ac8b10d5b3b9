"""Who sends how many requests where, for the tail model (pure): each row's weight under the
``load`` rule, each sidecar's own request rate, each graph's request rate. Split from
:mod:`meshtax.predict.stations`, which re-exports them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from meshtax.model.ecg import EcgBatch

FloatArray = npt.NDArray[np.float64]

__all__ = ["graph_rates", "request_rate", "row_weights", "sidecar_rates"]


def graph_rates(batch: EcgBatch, load: str) -> FloatArray:
    """Requests/s of each graph (its root calls): under ``pairs`` the graphs are samples of
    one mix and share its request rate equally."""
    roots = batch.parent < 0
    w = (row_weights(batch, load) * batch.rate)[roots]
    g = batch.graph_of()[roots]
    return np.asarray(np.bincount(g, weights=w, minlength=batch.n_graphs), dtype=np.float64)


def request_rate(batch: EcgBatch, load: str) -> float:
    """Requests/s entering the graphs: their root calls' rates (``pairs``: once per pair)."""
    return float(graph_rates(batch, load).sum())


def row_weights(batch: EcgBatch, load: str) -> FloatArray:
    """How much of its rate each row adds to the load: 1 (``graphs``), or 1 / the number of
    rows of its caller→callee pair (``pairs``: the rate is the pair's, counted once)."""
    n = batch.n_invocations
    if load == "graphs" or n == 0:
        return np.ones(n)
    key = (batch.caller + 1) * (len(batch.services) + 1) + batch.callee
    _, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
    return np.asarray(1.0 / counts[inv], dtype=np.float64)


def sidecar_rates(batch: EcgBatch, load: str) -> FloatArray:
    """Per row and side (rows × 2), the requests per second through that side's sidecar: every
    side of every call it takes part in, at the calls' rates (under ``load``) — one hop's
    request rate for a sidecar of one hop, the unit the capacity runs measured in (0: no
    sidecar). The load factor is looked up there: a sidecar handles several requests per
    wake-up only when its *own* traffic overlaps; sidecars of other services on the same CPU
    keep it warm (the engine's price, :mod:`~meshtax.predict.shared_cpu`) but do not hand it
    their requests (issue #20, set 2: Bookinfo's five sidecars at 180–1 700 requests/s each
    were priced at the CPU's 830–3 000/s and came out at half the CPU they used)."""
    n = batch.n_invocations
    out = np.zeros((n, 2))
    if n == 0:
        return out
    w = row_weights(batch, load) * batch.rate
    svc = np.stack([batch.caller, batch.callee], axis=1)
    meshed = np.stack([batch.caller_spec >= 0, batch.callee_spec >= 0], axis=1) & (svc >= 0)
    per = np.bincount(
        svc[meshed], weights=np.repeat(w[:, None], 2, axis=1)[meshed], minlength=len(batch.services)
    )
    out[meshed] = per[svc[meshed]]
    return out
