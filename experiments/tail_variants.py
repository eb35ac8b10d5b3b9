"""Recorded tail validations (one hop and topologies) predicted again under variants of the
tail model — to choose its defaults on runs other than the ones the benchmark reports.

``.venv/bin/python experiments/tail_variants.py --db DB --doc DIR/onehop-http-of-mesh.json
[--doc DIR/bookinfo-http-of-mesh.json] [--variants even-constant,poisson-latency,…]``

A topology document is predicted from the no-mesh traces its run kept per level
(``DIR/<stem>-work/…/no_mesh-traces-<fraction>.json``, written by ``bench_tail.py``). Prints,
per variant and document, the median absolute error and the bias of each percentile over the
sustained levels, then over all documents. Offline: nothing is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from _pooled_queue_s10_17 import POOLED_QUEUE_S10_17

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.queueing import Shape
from meshtax.predict.stations import TailOptions, request_rate, sidecar_rates
from meshtax.store.sqlite import ProfileStore
from meshtax.traces import SpanOptions, load_traces
from meshtax.validate.tail import (
    TOPOLOGY_SHARED_SCV,
    Predicted,
    TailPoint,
    TailRun,
    cost_calibration,
    mesh_cpu_us,
    paced_jitter,
    predict_one_hop,
    predict_traces_tail,
)
from meshtax.validate.tail_run import one_hop_options
from meshtax.validate.tail_traces import arrival_lag_us

PCTS = (50.0, 90.0, 99.0)
DRAWS = 40_000

#: name → what the variant changes of the validation's options (``capacity: False``: the
#: profile without its capacity runs, so crossings cost what one client's do at every rate)
# the models adopted since set 11, each the one before with one change (the variants below)
_S11: Mapping[str, Any] = {
    "lag_traces": True,
    "topology_scv": TOPOLOGY_SHARED_SCV,
    "one_hop_paced": True,
    "one_hop_wakeup": 1000.0,
    "topology_ramp_price": True,
    "calibrate": False,
}
_S12 = {**_S11, "ramp_queue": True}
_S12_ONE = {**_S11, "one_hop_ramp_queue": True}
_SHAPE = (1.377, -0.355)
_S13 = {**_S12, "ramp_shape": _SHAPE}
# a topology's arrivals as the client sends them: fortio's even schedule and its 1 ms wake-ups
_EVEN = {**_S13, "lag_traces": False, "arrivals": 0.0, "wakeup_us": 1000.0}

VARIANTS: dict[str, Mapping[str, Any]] = {
    "default": {"lag_traces": True},
    # set 3's model: no relief of a queue's sidecar work
    "no-relief": {"lag_traces": True, "relief": False},
    # set 3's model exactly (with --calibrate the level is left out, but nothing is fitted)
    "set3": {"lag_traces": True, "relief": False, "calibrate": False},
    # set 4's model without the cost scale
    "s4-nocal": {
        "lag_traces": True,
        "topology_scv": TOPOLOGY_SHARED_SCV,
        "calibrate": False,
        "batching": False,
    },
    # set 4's: a topology's request work on the shared CPUs with SCV 0.25 (chosen on sets 1–3),
    # one hop's exponential; with --calibrate, a topology's cost scale from a level not scored
    "s4": {"lag_traces": True, "topology_scv": TOPOLOGY_SHARED_SCV, "batching": False},
    "s4-scv05": {"lag_traces": True, "topology_scv": 0.5, "batching": False},
    "s4-norelief": {"lag_traces": True, "topology_scv": TOPOLOGY_SHARED_SCV, "relief": False},
    "set3-cal": {"lag_traces": True, "relief": False},
    # set 5's: set 4's with relief only from one request in the system on (batching; chosen
    # on sets 1–4, set 4 seen)
    "s5": {"lag_traces": True, "topology_scv": TOPOLOGY_SHARED_SCV},
    # set 7's: one hop on fortio's even schedule, equal requests, the no-mesh tail's stalls
    # drained at 1 − ρ (validate.tail_run.one_hop_options; chosen on sets 1–6, all seen);
    # a topology as s5
    "s7": {"lag_traces": True, "topology_scv": TOPOLOGY_SHARED_SCV, "one_hop_paced": True},
    # set 8's candidate: s7 with the load generator sending only when awake — on a response,
    # else every 1 000 µs when idle (Go's netpoller; TailOptions.wakeup_us); one hop only
    "s8": {
        "lag_traces": True,
        "topology_scv": TOPOLOGY_SHARED_SCV,
        "one_hop_paced": True,
        "one_hop_wakeup": 1000.0,
    },
    # set 10's candidate (registered before set 10 ran, reading R8): s8, and a topology's
    # crossings priced as the profile's own sidecar costs at each sidecar's own rate — per
    # level, the cost scale = Σ sidecars' sides × the capacity ramp's CPU per request (the
    # sidecar's plus the app's change) at its own rate ÷ the model's price; nothing fitted
    "s10-ramp": {
        "lag_traces": True,
        "topology_scv": TOPOLOGY_SHARED_SCV,
        "one_hop_paced": True,
        "one_hop_wakeup": 1000.0,
        "ramp_scale": True,
        "calibrate": False,  # with --calibrate its level is left out, nothing is fitted
    },
    # after set 10 (post hoc, exploratory): the ramp's sidecar CPU alone at own rates (the
    # echo's change with the mesh, negative on set 10's profile, left out)
    "s10-ramp-sidecar": {
        "lag_traces": True,
        "topology_scv": TOPOLOGY_SHARED_SCV,
        "one_hop_paced": True,
        "one_hop_wakeup": 1000.0,
        "ramp_scale": "sidecar",
        "calibrate": False,
    },
    # set 11's model (s10-ramp-sidecar held there): the same price inside the model
    # (TailOptions.ramp_price, as validate.tail_run.topology_options sets it) — a check that
    # the model reproduces the variant it adopted
    "s11": _S11,
    # after set 11 (post hoc, exploratory): s11 with one hop's no-mesh stall backlog off (its
    # drains at 1 − ρ grow without bound near ρ = 1, where one hop came out 1.9–4× over)
    "s11-nostalls": {**_S11, "one_hop_stalls": False},
    # set 12's candidate (registered before set 12 ran, designed on sets 10–11): s11, and on
    # every graph's shared CPUs what a request waits more with the mesh at most the queue the
    # profile's capacity ramp showed at the same load fraction (rate ÷ the predicted
    # saturation rate), in the station's times per request (TailOptions.ramp_queue,
    # predict/ramp_queue.py); nothing fitted, saturation unchanged
    "s12-ramp-cap": _S12,
    # set 12's second candidate (registered with s12-ramp-cap, judged only if that one does
    # not hold): the same bound only where the shared CPUs carry a single sidecar — the
    # profile's own bed (the validation's one hop); a topology as s11
    "s12-ramp-cap-one": _S12_ONE,
    # set 13's candidate (registered before set 13 ran, designed on sets 10–12, all seen):
    # s12-ramp-cap with each sidecar's ramp price below a quarter of the closed loop's rate
    # read from one power law of the rate's fraction of the closed loop's, × the closed
    # loop's CPU per request (TailOptions.ramp_shape) — the law fitted on the three profiles'
    # ramp runs at ≤ 25 % (sets 10–12, 12 runs; not on any topology's measurement), whose
    # low runs moved 2.3× between sittings while the closed loop moved ≤ 15 %
    "s13-ramp-shape": _S13,
    # after set 12 (exploratory, beside s13-ramp-shape): the same with a topology's request
    # work on the shared CPUs steadier (SCV 0.1), without the ramp's queue bound there, and
    # without relief
    # set 14's candidate (registered before set 14 ran, designed on sets 10–13, all seen):
    # s13-ramp-shape with a topology's closed loop (its saturation, and so the queue bound's
    # load fraction) priced at u_R × (own rate ÷ R)^−0.355 per sidecar — the ramp shape's
    # exponent through the profile's closed loop — instead of the models' price × one hop's
    # queue factor (TailOptions.closed_shape); one hop unchanged
    "s14-closed-shape": {**_S13, "closed_shape": True},
    # after set 13 (exploratory, seen sets 10–13, not judged): what moves Bookinfo's 50 % level
    # (over in every set) — a topology's request work constant (SCV 0), its arrivals on the even
    # schedule without the entry spans' lag, fortio's 1 ms wake-ups, the no-mesh stall backlog
    "s13-scv0": {**_S13, "topology_scv": 0.0},
    "s13-even": {**_S13, "lag_traces": False, "arrivals": 0.0},
    "s13-wake": {**_S13, "wakeup_us": 1000.0},
    "s13-stalls-scv0": {**_S13, "topology_scv": 0.0, "stalls": True},
    "s13-shape-scv01": {**_S13, "topology_scv": 0.1},
    "s13-shape-nobound": {**_S12_ONE, "ramp_shape": _SHAPE},
    "s13-shape-norelief": {**_S13, "relief": False},
    # after set 14 (exploratory, seen sets 10–14, not judged): a topology's arrivals as the
    # client sends them — fortio's even schedule and its 1 ms wake-ups — instead of the entry
    # spans' lag (which holds the entry's own wait for the CPU without the mesh)
    "s15x-wake-even": _EVEN,
    "s15x-wake-even-scv0": {**_EVEN, "topology_scv": 0.0},
    "s15x-wake-even-scv005": {**_EVEN, "topology_scv": 0.05},
    # the ramp's queue bound alone (a request's work so variable that the bound always binds)
    "s15x-cap": {**_S13, "topology_scv": 4.0},
    "s15x-steady-nostalls": {**_EVEN, "topology_scv": "measured"},
    "s15x-steady": {**_EVEN, "topology_scv": "measured", "stalls": True},
    # set 15's candidate (registered before set 15 ran, designed on sets 10–14, all seen):
    # s13-ramp-shape with a topology's request on the shared CPUs as the client sends it and
    # as steady as the no-mesh level shows it — arrivals on fortio's even schedule with its
    # 1 ms wake-ups (not the entry spans' lag, which holds the entry's own wait for the CPU),
    # and the work's variation the level's no-mesh latencies' (each request's deviation from
    # their mean added to the priced mean work; nearly constant in the body, a tail of stalls)
    # instead of a gamma of SCV 0.25 (chosen on sets 1–3); one hop and saturation unchanged
    "s15-steady-work": {**_EVEN, "topology_shape": "no-mesh"},
    "s15x-shape-lag": {**_S13, "topology_shape": "no-mesh"},
    # after set 15 (exploratory, seen sets 10–15): the queue bound read where the ramp measured
    # it — between two runs in 1 ÷ (1 − load fraction), the coordinate a queue grows linearly
    # in near saturation, not linearly in the fraction (TailOptions.ramp_heavy); and one hop
    # (the profile's own bed) at its rate ÷ the bed's measured closed loop, not ÷ the predicted
    # saturation rate, 6.7–11.9 % below it on sets 10–15 (TailOptions.ramp_own_bed)
    "s16x-heavy": {**_S13, "ramp_heavy": True},
    "s16x-own-bed": {**_S13, "one_hop_own_bed": True},
    "s16x-heavy-own-bed": {**_S13, "ramp_heavy": True, "one_hop_own_bed": True},
    # set 16's candidate (registered before set 16 ran, designed on sets 10–15, all seen; the
    # same as s16x-own-bed): s13-ramp-shape with one hop's queue bound read at its rate ÷ the
    # profile's measured closed loop (its own bed's maximum, the denominator of the ramp's own
    # fractions) instead of ÷ the model's predicted saturation rate; a topology and saturation
    # unchanged by construction
    "s16-own-bed": {**_S13, "one_hop_own_bed": True},
    # set 17's candidate (registered before set 17; seen 10–16): TailOptions.ramp_plateau
    "s17-plateau": {**_S13, "ramp_plateau": True},
    # set 18's candidate (registered before set 18; seen 10–17): one hop's and a topology's
    # queue bound read from the ramps' queue pooled (median) over sets 10–17's eight profiles
    # (TailOptions.ramp_pooled, _pooled_queue_s10_17.py) instead of the profile's own single
    # 2 s runs; prices and saturation unchanged by construction
    "s18-pooled-queue": {**_S13, "ramp_pooled": POOLED_QUEUE_S10_17},
    # set 19's candidate (registered before set 19; nothing seen: no profile had repeats):
    # s18-pooled-queue with the queue bound read from the profile's own ramp, each repeated
    # rate (0.25–0.9 of the closed loop, 3 runs each: Capacity.repeats) the median of its runs
    # at each rank (TailOptions.ramp_repeats), the pooled table only for a profile without
    # repeats; prices and saturation unchanged by construction
    "s19-own-repeats": {**_S13, "ramp_pooled": POOLED_QUEUE_S10_17, "ramp_repeats": True},
    # set 20's candidate (registered before set 20; seen: set 19 only, the first profile of this
    # slower machine): s18-pooled-queue with a topology's ramp price below a quarter of the
    # closed loop read from the profile's own ramp shape — the least-squares law of its runs
    # there, with the repeats (TailOptions.ramp_own_shape, predict/ramp_price.own_shape) —
    # instead of RAMP_SHAPE (sets 10–12's profiles of the older VM); one hop (the profile's own
    # bed, not priced from the ramp), the queue bound and saturation unchanged by construction
    "s20-own-shape": {**_S13, "ramp_pooled": POOLED_QUEUE_S10_17, "ramp_own_shape": True},
    # set 21's candidate (registered before set 21; seen: sets 19–20, this slower machine):
    # s20-own-shape (the model) with the queue bound (one hop's and a topology's) the profile's
    # own queue form, k × f/(1 − f) × −ln(1 − u) requests' worth, its one constant k fitted
    # (least squares) on all its ramp's draws at ≥ half the closed loop (TailOptions.ramp_form,
    # predict/ramp_queue.queue_form), the pooled table only for a profile without 3 such draws;
    # prices and saturation unchanged by construction
    "s21-queue-form": {
        **_S13,
        "ramp_pooled": POOLED_QUEUE_S10_17,
        "ramp_own_shape": True,
        "ramp_form": True,
    },
    "s5-scv05": {"lag_traces": True, "topology_scv": 0.5},
    "s5-scv1": {"lag_traces": True},
    "s4-scv1": {"lag_traces": True, "batching": False},
    "relief-stalls": {"lag_traces": True, "stalls": True},
    "relief-scv05": {"lag_traces": True, "shared_scv": 0.5},
    "relief-scv025": {"lag_traces": True, "shared_scv": 0.25},
    "relief-scv0": {"lag_traces": True, "shared_scv": 0.0},
    "relief-stalls-scv05": {"lag_traces": True, "stalls": True, "shared_scv": 0.5},
    "poisson": {},
    "even-constant": {"arrivals": 0.0, "shared_scv": 0.0},
    "even-scv05": {"arrivals": 0.0, "shared_scv": 0.5},
    "ca05": {"arrivals": 0.5},
    "stalls": {"stalls": True},
    # the paced schedule with a lag calibrated on the profile's capacity ramp (paced_jitter)
    "paced": {"paced": True},
    # the arrival lag measured on the level's own no-mesh traces (arrival_lag_us; one hop:
    # Poisson, what an even schedule with such a lag is at its spacing)
    "lag-traces": {"lag_traces": True},
    "lag300": {"jitter_us": 300.0},
    "lag600": {"jitter_us": 600.0},
    "lag1000": {"jitter_us": 1000.0},
    # the no-mesh pods' whole busy CPU per request (kernel networking, interrupts, other
    # processes on the pods' CPU) instead of the applications' alone
    "busy-cpu": {"busy_cpu": True},
    "stalls-even": {"stalls": True, "arrivals": 0.0},
    "stalls-even-scv05": {"stalls": True, "arrivals": 0.0, "shared_scv": 0.5},
    "stalls-even-constant": {"stalls": True, "arrivals": 0.0, "shared_scv": 0.0},
    "ca05-scv05": {"arrivals": 0.5, "shared_scv": 0.5},
    "even": {"arrivals": 0.0},
    "constant": {"shared_scv": 0.0},
    "scv2": {"shared_scv": 2.0},
    "open": {"clients": None},
    "one-client-cpu": {"capacity": False},
    "previous": {"arrivals": 0.0, "shared_scv": 0.0, "clients": None, "capacity": False},
    # a diagnostic, not a prediction: every sidecar's CPU scaled so that a request's mesh CPU
    # is what the level measured with the mesh (sidecars + the app's change) — what is left
    # is the queueing model's error
    "measured-cpu": {"measured_cpu": True},
    "mcpu-even": {"measured_cpu": True, "arrivals": 0.0},
    "mcpu-constant": {"measured_cpu": True, "shared_scv": 0.0},
    "mcpu-even-constant": {"measured_cpu": True, "arrivals": 0.0, "shared_scv": 0.0},
    "mcpu-even-scv05": {"measured_cpu": True, "arrivals": 0.0, "shared_scv": 0.5},
}


def _point(d: Mapping[str, Any]) -> TailPoint:
    pairs = tuple(
        (TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in d["runs"]
    )
    passes = tuple(int(x) for x in d.get("passes", ()))
    return TailPoint(float(d["fraction"]), float(d["rate"]), pairs, passes=passes)


def _traces(doc_path: Path, doc: Mapping[str, Any], fraction: float) -> Path:
    work = doc_path.with_name(doc_path.stem + "-work")
    found = sorted(work.glob(f"*/no_mesh-traces-{fraction:g}.json"))
    if not found:
        raise SystemExit(f"{doc_path}: no kept traces for level {fraction:g} under {work}")
    return found[0]


def predict(
    doc_path: Path,
    doc: Mapping[str, Any],
    prof: Any,
    pt: TailPoint,
    opts: TailOptions,
    lag_traces: bool = False,
) -> Predicted:
    t = doc["tail"]
    mode = Mode(t["mode"])
    if t["topology"] == "one-hop":
        base = [q for b, _ in pt.pairs for q in b.quantiles_us]
        o = replace(opts, samples=max(20, DRAWS // max(len(base), 1)))
        size = int(doc["options"].get("size_bytes", 100))
        return predict_one_hop(prof, SidecarConfig(mode), size, pt.rate, base, o)
    modes = doc["options"].get("sidecar_modes", {})
    configs = {s: SidecarConfig(Mode(m)) for s, m in modes.items()}
    o = replace(opts, samples=DRAWS)
    if lag_traces:
        path = _traces(doc_path, doc, pt.fraction)
        o = replace(o, jitter_us=arrival_lag_us(json.loads(path.read_text()), pt.rate))
    return predict_traces_tail(str(_traces(doc_path, doc, pt.fraction)), prof, configs, pt.rate, o)


def errors(
    doc_path: Path,
    doc: Mapping[str, Any],
    prof: Any,
    change: Mapping[str, Any],
    show: bool = False,
    calibrate: float | None = None,
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {f"p{p:g}": [] for p in PCTS}
    out["saturation"] = []
    pods = _pod_cpus(str(doc["options"].get("pinning", "")))
    points = doc["tail"]["points"]
    scale = 1.0
    topo = doc["tail"]["topology"] != "one-hop"  # one hop: the profile's own bed
    if calibrate is not None:  # the level a topology's cost scale is fitted on: not scored
        cal = [d for d in points if abs(float(d["fraction"]) - calibrate) < 1e-6]
        if not cal and not topo:
            cal = [None]  # one hop fits nothing: a set that did not measure the level on it
        if not cal:
            raise SystemExit(f"{doc_path}: no level {calibrate:g} to calibrate on")
        points = [d for d in points if d is not cal[0]]
        if topo and change.get("calibrate", True):
            scale = _calibration(doc_path, doc, prof, change, _point(cal[0]), pods)
            print(f"    {doc['tail']['topology']}: cost scale {scale:.3f} (level {calibrate:.0%})")
    last = len(points) - 1
    for i, d in enumerate(points):
        pt = _point(d)
        if not pt.pairs or (not pt.sustained and i != last):
            continue
        app = statistics.median(b.cpu_us_per_request("app") for b, _ in pt.pairs)
        if change.get("busy_cpu"):  # the pods' busy CPU per request without the mesh
            app = statistics.median(b.cpu_us_per_request("pods_busy") for b, _ in pt.pairs)
        clients = int(doc["options"].get("connections", 32))
        base = TailOptions(percentiles=PCTS, pod_cpus=pods, app_cpu_us=app, clients=clients)
        opts = replace(base, **{k: v for k, v in change.items() if k in OPTIONS})
        opts = replace(opts, cost_scale=opts.cost_scale * scale)
        if not topo and change.get("one_hop_paced"):
            opts = one_hop_options(replace(opts, arrivals=0.0))
            opts = replace(opts, wakeup_us=change.get("one_hop_wakeup"))
            opts = replace(opts, stalls=bool(change.get("one_hop_stalls", True)))
            # one_hop_options pools the ramps' queue since set 18; a variant says its own
            opts = replace(opts, ramp_pooled=change.get("ramp_pooled"))
        if not topo and change.get("one_hop_own_bed"):
            opts = replace(opts, ramp_own_bed=True)
        if not topo and change.get("one_hop_ramp_queue"):
            opts = replace(opts, ramp_queue=True)
        if topo and change.get("topology_ramp_price"):
            opts = replace(opts, ramp_price=True)
        if topo and change.get("topology_scv") == "measured":
            opts = replace(opts, shared_scv=body_scv(pt))
            if show:
                print(
                    f"    {pt.fraction:.0%}: request work SCV {opts.shared_scv:.4f} (no-mesh body)"
                )
        elif topo and "topology_scv" in change:
            opts = replace(opts, shared_scv=float(change["topology_scv"]))
        if topo and change.get("topology_shape") == "no-mesh":
            cheap = replace(opts, samples=20, ramp_queue=False)
            first = predict(doc_path, doc, use_of(prof, change), pt, cheap, False)
            work = first.utilisation * pods * 1e6 / pt.rate  # the priced work a request, µs
            sh = nomesh_shape(pt, work)
            opts = replace(opts, shared_shape=sh)
            if show:
                print(
                    f"    {pt.fraction:.0%}: request work {work:.0f} µs, shape from the no-mesh "
                    f"latencies: p90 {sh.quantile(np.array([0.9]))[0]:.3f}, p99 "
                    f"{sh.quantile(np.array([0.99]))[0]:.3f}"
                )
        if change.get("paced"):
            lag = _lag(prof, Mode(doc["tail"]["mode"]), base)
            print(f"    paced: lag {lag} µs (calibrated on the profile's capacity ramp)")
            opts = replace(opts, jitter_us=lag)
        # the ramp's queue bound as the variant says (the model's rules turn it on since set 12)
        bound = change.get("ramp_queue") or (not topo and change.get("one_hop_ramp_queue"))
        opts = replace(opts, ramp_queue=bool(bound))
        use = _without_capacity(prof) if "capacity" in change else prof
        lag = bool(change.get("lag_traces"))
        if topo and change.get("ramp_scale"):
            alone = change["ramp_scale"] == "sidecar"
            rs, ramp = ramp_scale(doc_path, doc, use, pt, replace(opts, samples=20), pods, alone)
            opts = replace(opts, cost_scale=opts.cost_scale * rs)
            if show:
                print(
                    f"    {pt.fraction:.0%}: cost scale from the ramp at own rates {rs:.3f}: "
                    f"{ramp:.0f} CPU-µs a request, measured {mesh_cpu_us(pt):.0f}"
                )
        got = predict(doc_path, doc, use, pt, opts, lag)
        if change.get("measured_cpu"):
            mesh = statistics.median(
                m.cpu_us_per_request("sidecar") + m.cpu_us_per_request("app") for _, m in pt.pairs
            )
            priced = got.utilisation * 1e6 / pt.rate - app  # the shared CPUs' mesh work
            got = predict(doc_path, doc, _cpu_scaled(use, (mesh - app) / priced), pt, opts, lag)
        if i == last:  # the validation's predicted saturation: its highest level's
            sat = got.saturation_rate
            meas = float(doc["tail"]["max_mesh"])
            out["saturation"].append((sat - meas) / meas)
            if show:
                print(f"    saturation predicted {sat:.0f}/s, measured {meas:.0f}/s")
            if not pt.sustained:
                continue
        if show:
            cells = ", ".join(
                f"{k} {got.overhead[k][0]:.0f} vs {pt.measured(k).median:.0f}"
                for k in [f"p{p:g}" for p in PCTS]
            )
            print(f"    {pt.fraction:.0%} {pt.rate:.0f}/s ρ {got.utilisation:.2f}: {cells}")
        for k in [f"p{p:g}" for p in PCTS]:
            m = pt.measured(k).median
            v = got.overhead[k][0]
            if m and v == v and abs(v) != float("inf"):
                out[k].append((v - m) / m)
                h = pt.halves(k)
                if h is None:
                    continue
                # the halves (passes) of the level: how far apart, and the same prediction's
                # error on each on its own
                out.setdefault(f"{k} halves", []).append((h[0] - h[1]) / abs(m))
                for i, x in enumerate(h):
                    if x:
                        out.setdefault(f"{k} half {i + 1}", []).append((v - x) / x)
                if show:
                    print(f"      {k} halves {h[0]:.0f} / {h[1]:.0f} (whole {m:.0f})")
    return out


def _calibration(
    doc_path: Path,
    doc: Mapping[str, Any],
    prof: Any,
    change: Mapping[str, Any],
    pt: TailPoint,
    pods: int,
) -> float:
    """The cost scale fitted on level ``pt`` (``validate.tail.cost_calibration``)."""
    app = statistics.median(b.cpu_us_per_request("app") for b, _ in pt.pairs)
    clients = int(doc["options"].get("connections", 32))
    base = TailOptions(percentiles=PCTS, pod_cpus=pods, app_cpu_us=app, clients=clients)
    opts = replace(base, **{k: v for k, v in change.items() if k in OPTIONS})
    o = replace(opts, samples=20)
    return cost_calibration(pt, predict(doc_path, doc, prof, pt, o, False), o, pods)


def ramp_scale(
    doc_path: Path,
    doc: Mapping[str, Any],
    prof: Profile,
    pt: TailPoint,
    opts: TailOptions,
    pods: int,
    sidecar_only: bool = False,
) -> tuple[float, float]:
    """A topology level's cost scale from the profile alone: Σ over its sidecars of sides per
    request × the capacity ramp's mesh CPU per request (``Capacity.cpu_samples``: the
    sidecar's plus the app's change) at the sidecar's own rate (interpolated in log rate,
    held beyond the runs), ÷ the model's price of the level (as ``cost_calibration`` reads
    it), and that price (CPU-µs per request). Why (issue #20, set 10's R8): the model prices
    a message at the shared CPU's rate (warmer, cheaper) and only then × the load factor at
    the sidecar's own rate. ``sidecar_only``: the ramp's sidecar CPU alone (fixed-rate runs)."""
    modes = doc["options"].get("sidecar_modes", {})
    configs = {n: SidecarConfig(Mode(m)) for n, m in modes.items()}
    path = _traces(doc_path, doc, pt.fraction)
    b = load_traces(str(path), "otlp", SpanOptions(sidecars=configs)).batch
    b = replace(b, rate=b.rate * (pt.rate / request_rate(b, "pairs")))
    own = sidecar_rates(b, "pairs")
    svc = np.stack([b.caller, b.callee], axis=1)
    specs = np.stack([b.caller_spec, b.callee_spec], axis=1)
    ramp = 0.0
    for s in np.unique(svc[own > 0]):
        mine = (svc == s) & (own > 0)  # every side of a sidecar has its one own rate
        r, spec = float(own[mine][0]), int(specs[mine][0])
        mp = prof.modes.get(b.specs[spec].config.mode)
        cap = mp.capacity if mp is not None else None
        pts = cap.cpu_samples() if cap is not None else ()
        if sidecar_only and cap is not None:  # the sidecar's own CPU, no app change
            pts = tuple(
                sorted(
                    (p.achieved, p.sidecar_cpu / p.achieved * 1e6)
                    for p in cap.points
                    if p.meshed and p.target > 0 and p.achieved > 0
                )
            )
        if not pts:
            return 1.0, float("nan")
        x, y = np.log([q for q, _ in pts]), np.array([u for _, u in pts])
        ramp += r / pt.rate * float(np.interp(np.log(r), x, y))
    got = predict(doc_path, doc, prof, pt, replace(opts, cost_scale=1.0), False)
    priced = got.utilisation * pods * 1e6 / pt.rate - opts.app_cpu_us
    return (ramp / priced if priced > 0 else 1.0), ramp


#: the standard normal's 90th percentile: (p90 − p50) ÷ it is a normal body's deviation
Z90 = 1.2815515655446004


def body_scv(pt: TailPoint) -> float:
    """A topology request's work variability from the level's no-mesh runs: the squared
    ((p90 − p50) ÷ z₀.₉₀ ÷ p50) of their pooled latencies (medians over the pairs). Without
    the mesh the pods' CPUs are 15–50 % busy and arrivals even, so a request's latency is its
    work and its path's: the body (not the stalls' tail above p90) is how much that varies;
    with the mesh a request's work is taken to vary relatively as much."""
    p50 = statistics.median(b.percentiles_us["p50"] for b, _ in pt.pairs)
    p90 = statistics.median(b.percentiles_us["p90"] for b, _ in pt.pairs)
    return float(max(p90 - p50, 0.0) / Z90 / p50) ** 2 if p50 > 0 else 0.0


def nomesh_shape(pt: TailPoint, work_us: float) -> Shape:
    """A topology request's work on the shared CPUs (mean ``work_us``, the priced one with
    the mesh) as it varies without the mesh: the level's no-mesh latencies pooled over its
    pairs (their quantile sketches), each request's deviation from their mean added to the
    mean work — what holds a request up without the mesh (a longer piece of work, an
    interrupt, another process on the CPU) holds the shared CPUs as long with it."""
    q = np.array([b.quantiles_us for b, _ in pt.pairs if b.quantiles_us], dtype=np.float64)
    lat = np.sort(q.ravel())
    probs = np.linspace(0.0, 1.0, 201)
    at = np.quantile(lat, probs)
    return Shape.from_quantiles(probs, np.maximum(work_us + at - float(lat.mean()), 0.0))


def use_of(prof: Profile, change: Mapping[str, Any]) -> Profile:
    return _without_capacity(prof) if "capacity" in change else prof


OPTIONS = {f.name for f in fields(TailOptions)}
_LAGS: dict[str, float | None] = {}


def _lag(prof: Profile, mode: Mode, opts: TailOptions) -> float | None:
    if prof.name not in _LAGS:
        lag, errs = paced_jitter(prof, mode, opts)
        print("    paced_jitter errors: " + ", ".join(f"{k:g} µs {v:.0%}" for k, v in errs.items()))
        _LAGS[prof.name] = lag
    return _LAGS[prof.name]


def _cpu_scaled(prof: Profile, f: float) -> Profile:
    """Every CPU model and capacity run's sidecar CPU × ``f``."""
    modes = {}
    for m, mp in prof.modes.items():
        comps = {c: replace(cm, cpu=cm.cpu.scaled(f)) for c, cm in mp.components.items()}
        cap = mp.capacity
        if cap is not None:
            pts = tuple(
                replace(
                    p,
                    sidecar_cpu=p.sidecar_cpu * f,
                    shared_cpu=p.shared_cpu + (f - 1) * p.sidecar_cpu,
                )
                for p in cap.points
            )
            cap = replace(cap, points=pts)
        modes[m] = replace(mp, components=comps, capacity=cap)
    return replace(prof, modes=modes)


def _without_capacity(prof: Profile) -> Profile:
    return replace(prof, modes={m: replace(mp, capacity=None) for m, mp in prof.modes.items()})


def _pod_cpus(described: str) -> int:
    """The pods' CPUs of a pinning as described (``client=0 sidecars=1 app=1``)."""
    roles = dict(x.split("=", 1) for x in described.split() if "=" in x)
    cpus = {c for r in ("sidecars", "app") for c in roles.get(r, "").split(",") if c.strip()}
    return max(1, len(cpus))


def _cell(e: list[float]) -> str:
    if not e:
        return "-"
    return f"{statistics.median(abs(x) for x in e):.0%} ({statistics.fmean(e):+.0%}, {len(e)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--doc", action="append", required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--levels", action="store_true", help="print every level's numbers")
    ap.add_argument(
        "--calibrate",
        type=float,
        default=None,
        help="fit each document's cost scale on this level (a fraction, e.g. 0.6) and score "
        "the others (validate.tail.cost_calibration)",
    )
    a = ap.parse_args()
    store = ProfileStore(a.db)
    docs = [(Path(p), json.loads(Path(p).read_text())) for p in a.doc]
    print(
        "| variant | document | "
        + " | ".join(f"p{p:g} median abs (bias, n)" for p in PCTS)
        + " | saturation error |"
    )
    print("|---|---|" + "---|" * (len(PCTS) + 1))
    for name in a.variants.split(","):
        every: dict[str, list[float]] = {f"p{p:g}": [] for p in PCTS}
        every["saturation"] = []
        for path, doc in docs:
            errs = errors(
                path, doc, store.get(doc["profile"]), VARIANTS[name], a.levels, a.calibrate
            )
            for k, v in errs.items():
                every.setdefault(k, []).extend(v)
            cells = " | ".join(_cell(errs[f"p{p:g}"]) for p in PCTS)
            sat = ", ".join(f"{x:+.1%}" for x in errs["saturation"])
            print(f"| {name} | {doc['tail']['topology']} | {cells} | {sat} |")
            _halves(name, doc["tail"]["topology"], errs)
        if len(docs) > 1:
            cells = " | ".join(_cell(every[f"p{p:g}"]) for p in PCTS)
            print(f"| {name} | all | {cells} | |")
            _halves(name, "all", every)


def _halves(name: str, what: str, errs: Mapping[str, list[float]]) -> None:
    """Rows of the levels' halves (when the records have them): how far apart (the
    difference ÷ the whole level's overhead, median abs and mean), and the errors on each."""
    for part in ("halves", "half 1", "half 2"):
        if any(f"p{p:g} {part}" in errs for p in PCTS):
            cells = " | ".join(_cell(errs.get(f"p{p:g} {part}", [])) for p in PCTS)
            print(f"| {name} | {what}: {part} | {cells} | |")


if __name__ == "__main__":
    main()
