"""Per load level of recorded tail validations: the CPU the mesh measurably cost per request
(the sidecars' CPU plus how the applications' changed with them, from ``/proc`` around each
run) against what the tail model prices on the pods' shared CPUs, and how busy those CPUs
were — the physical side of a miss (issue #20).

``.venv/bin/python experiments/tail_cpu_audit.py --db DB --dir DIR`` (``DIR`` holds
``onehop-http-of-mesh.json`` and/or ``bookinfo-http-of-mesh.json`` and the latter's
``-work`` traces, as ``bench_tail.py`` writes them). Offline. Columns, µs per request
(medians over a level's pairs): the apps without / with the mesh, the sidecars, the mesh's
total (sidecars + the apps' change); the model's price of the mesh at the level, and what
one client's CPU models alone price (no load factor); the pods' CPU busy share without / with
the mesh, the model's utilisation of the shared CPUs, the measured one (apps + sidecars ×
rate), the steal share when recorded. ``--speed`` (``DIR/summary.json`` with the machine's
speed recorded around each validation, ``bench_tail.py --speed``): one more column, the mesh's
price with the costs scaled from the profile's speed to the median of the readings before and
after that validation (``TailOptions.speed``, as ``--speed now`` does).

``--per-sidecar`` (runs recorded since set 10, which keep each service's CPU apart:
``validate.tail_record.service_groups``): per topology level and service, the sidecar's own
rate (requests/s through it, every side), its sides per request, its measured CPU-µs per
request against the model's price of it (load factor at its own rate) and one client's (no
load factor), the ratio, and its app's change with the mesh; then each sidecar's connections
and requests (``-work/*/mesh/envoy-counters.json``: connections per request, whether they are
reused).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.model.ecg import EXTERNAL, Invocation, Service, to_batch, validate
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.model.speed import Speed, kind_factors, typical
from meshtax.predict.engine import single_profile
from meshtax.predict.stations import (
    TailOptions,
    crossings,
    request_rate,
    row_weights,
    sidecar_rates,
    station_mix,
    stations,
)
from meshtax.store.sqlite import ProfileStore
from meshtax.traces import SpanOptions, load_traces
from meshtax.validate.tail import TailRun

STEMS = ("onehop-http-of-mesh", "bookinfo-http-of-mesh")


def _batch(d: Path, stem: str, doc: dict[str, Any], fraction: float, rate: float) -> Any:
    if doc["tail"]["topology"] == "one-hop":
        size = float(doc["options"].get("size_bytes", 100))
        svc = {"echo": Service("echo", SidecarConfig(Mode(doc["tail"]["mode"])))}
        inv = Invocation("0", EXTERNAL, "echo", size, size, rate, 0.0, 100.0)
        return to_batch([validate("q", svc, [inv])])
    tf = sorted((d / f"{stem}-work").glob(f"*/no_mesh-traces-{fraction:g}.json"))[0]
    modes = doc["options"]["sidecar_modes"]
    cfg = {s: SidecarConfig(Mode(m)) for s, m in modes.items()}
    b = load_traces(str(tf), "otlp", SpanOptions(sidecars=cfg)).batch
    return replace(b, rate=b.rate * (rate / request_rate(b, "pairs")))


def _mesh_price(b: Any, prof: Profile, opts: TailOptions) -> tuple[float, float]:
    """(the shared CPUs' mean work per request, their utilisation) as the model prices them."""
    pl = single_profile(prof)
    sts = stations(b, pl, crossings(b, pl, opts, split=False), opts)
    got = station_mix(sts, sts.shared, 1.0)
    if got is None:
        return 0.0, 0.0
    return got[1].mean(), got[0] * got[1].mean() * 1e-6 / sts.servers[sts.shared]


def per_sidecar(b: Any, prof: Profile, opts: TailOptions) -> dict[str, dict[str, float]]:
    """Per meshed service: its sidecar's own rate (every side, /s), sides per request, and the
    model's CPU-µs per request for it (every crossing it takes part in, at the model's rates)."""
    pl = single_profile(prof)
    sts = stations(b, pl, crossings(b, pl, opts, split=False), opts)
    per_req = request_rate(b, opts.load)
    own = sidecar_rates(b, opts.load)
    w = row_weights(b, opts.load) * b.rate
    out: dict[str, dict[str, float]] = {}
    for k, name in enumerate(sts.names):
        if k == sts.shared:
            continue
        sel = sts.job_station == k
        rows = sts.of_side == k
        out[name] = {
            "rate": float(own[rows].max()) if rows.any() else 0.0,
            "sides": float(own[rows].max()) / per_req if rows.any() and per_req > 0 else 0.0,
            "priced_us": float((sts.job_rate[sel] * sts.job_mean[sel]).sum()) / per_req,
            # sides per request: as the callee (inbound) and as the caller (outbound)
            "in": float(w[sts.of_side[:, 1] == k].sum()) / per_req if per_req > 0 else 0.0,
            "out": float(w[sts.of_side[:, 0] == k].sum()) / per_req if per_req > 0 else 0.0,
        }
    return out


Row = dict[str, float]


def ramp_sidecar_us(prof: Profile, mode: Mode, rate: float) -> float:
    """The profile's own sidecar at ``rate`` requests/s: its CPU-µs per request on the
    capacity ramp's fixed-rate runs (the sidecar's alone, idle time included), interpolated in
    log rate, held beyond the runs (nan without a ramp). What a sidecar costs at its own rate
    with no shared-CPU discount (the model prices a message at the CPU's rate × the load factor
    at the sidecar's own)."""
    mp = prof.modes.get(mode)
    cap = mp.capacity if mp is not None else None
    pts = sorted(
        (p.achieved, p.sidecar_cpu / p.achieved * 1e6)
        for p in (cap.points if cap is not None else ())
        if p.meshed and p.target > 0 and p.achieved > 0
    )
    if not pts or rate <= 0:
        return float("nan")
    x, y = np.log([r for r, _ in pts]), np.array([u for _, u in pts])
    return float(np.interp(np.log(rate), x, y))


def readings(levels: dict[float, dict[str, Row]], upto: float = 0.75) -> dict[str, Any]:
    """Set 10's pre-registered readings over the levels up to ``upto`` (BENCHMARKS.md, issue
    #20): per sidecar the median R (measured ÷ (price + idle)) and R at the lowest level ÷ at
    ``upto``; the sidecars' share of the mesh's excess; an outbound side's CPU ÷ an inbound
    side's (an inbound side: the mean of the sidecars with no outbound side, per side)."""
    use = {f: rows for f, rows in levels.items() if f <= upto + 1e-9}
    if not use:
        return {}
    names = sorted({n for rows in use.values() for n in rows})
    med = statistics.median
    r = {n: med(rows[n]["ratio"] for rows in use.values() if n in rows) for n in names}
    lo, hi = min(use), max(use)
    trend = {n: use[lo][n]["ratio"] / use[hi][n]["ratio"] for n in names if n in use[hi]}
    shares, outs = [], []
    for rows in use.values():
        sc = sum(x["measured"] - x["price"] for x in rows.values())
        total = sc + sum(x["app_change"] for x in rows.values())
        shares.append(sc / total if total else float("nan"))
        ins = [x["measured"] / x["in"] for x in rows.values() if x["out"] == 0 and x["in"] > 0]
        if not ins:
            continue
        one_in = statistics.fmean(ins)
        outs += [
            (x["measured"] - x["in"] * one_in) / x["out"] / one_in
            for x in rows.values()
            if x["out"] > 0
        ]
    ramp = [rows[n]["ramp_ratio"] for rows in use.values() for n in rows]
    mid = med(r.values())
    return {
        "levels": sorted(use),
        "ratio": r,
        "uniform": all(abs(v / mid - 1) <= 0.2 for v in r.values()),
        "ratio_low_over_high": trend,
        "median_low_over_high": med(trend.values()) if trend else float("nan"),
        "sidecars_share_of_excess": med(shares),
        "outbound_over_inbound_side": med(outs) if outs else float("nan"),
        "median_ratio": mid,
        "median_measured_over_ramp": med(ramp),
    }


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return [_rounded(x) for x in v] if isinstance(v, list) else v


def _sidecar_table(d: Path, stem: str, doc: dict[str, Any], prof: Profile) -> None:
    levels: dict[float, dict[str, Row]] = {}
    plain = replace(prof, modes={m: replace(mp, capacity=None) for m, mp in prof.modes.items()})
    print(
        f"\n{stem}: per sidecar (µs per request; medians over a level's pairs)\n\n"
        "| load | service | own rate/s | sides | sidecar measured | priced | one client "
        "| idle | measured ÷ (priced + idle) | the ramp at own rate | measured ÷ ramp "
        "| app change |\n" + "|---" * 12 + "|"
    )
    for pd in doc["tail"]["points"]:
        pairs = [
            (TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in pd["runs"]
        ]
        if not any(k.startswith("sidecar:") for k in pairs[0][1].cpu_ns):
            print(f"| {pd['fraction']:.0%} | (no per-service CPU in this record) |")
            continue
        app0 = statistics.median(b.cpu_us_per_request("app") for b, _ in pairs)
        opts = TailOptions(pod_cpus=1, app_cpu_us=app0, clients=32, load="pairs")
        rate = float(pd["rate"])
        bt = _batch(d, stem, doc, float(pd["fraction"]), rate)
        model, one = per_sidecar(bt, prof, opts), per_sidecar(bt, plain, opts)
        # an idle sidecar's own CPU per second (the profile's), per request at the level's rate
        mp = prof.modes.get(Mode(doc["tail"]["mode"]))
        idle = (mp.idle_cpu_us_per_s or 0.0) / rate if mp is not None and rate > 0 else 0.0
        for name, m in model.items():
            sc = statistics.median(x.cpu_us_per_request(f"sidecar:{name}") for _, x in pairs)
            da = statistics.median(
                x.cpu_us_per_request(f"app:{name}") - b.cpu_us_per_request(f"app:{name}")
                for b, x in pairs
            )
            ratio = sc / (m["priced_us"] + idle) if m["priced_us"] > 0 else float("nan")
            # the rate a sidecar sees is over all its sides: the ramp's unit (one side each)
            ramp = m["sides"] * ramp_sidecar_us(prof, Mode(doc["tail"]["mode"]), m["rate"])
            levels.setdefault(float(pd["fraction"]), {})[name] = {
                "measured": sc,
                "price": m["priced_us"] + idle,
                "app_change": da,
                "ratio": ratio,
                "ramp_ratio": sc / ramp if ramp > 0 else float("nan"),
                "in": m["in"],
                "out": m["out"],
            }
            print(
                f"| {pd['fraction']:.0%} | {name} | {m['rate']:.0f} | {m['sides']:.0f} | "
                f"{sc:.0f} | {m['priced_us']:.0f} | {one[name]['priced_us']:.0f} | {idle:.0f} | "
                f"{ratio:.2f} | {ramp:.0f} | {sc / ramp if ramp > 0 else float('nan'):.2f} | {da:+.0f} |"
            )
    got = readings(levels)
    if got:
        print(f"\nreadings over the levels {', '.join(f'{x:.0%}' for x in got['levels'])}:")
        print(json.dumps(_rounded(got), indent=1))
    for f in sorted((d / f"{stem}-work").glob("*/mesh/envoy-counters.json")):
        print(f"\nconnections and requests per sidecar, the whole validation ({f.name}):\n")
        print("| service | downstream cx / rq | upstream cx / rq |\n|---|---|---|")
        for name, c in json.loads(f.read_text()).items():
            if "error" in c:
                print(f"| {name} | {c['error']} | |")
                continue
            print(
                f"| {name} | {c['downstream_cx_total']} / {c['downstream_rq_total']} | "
                f"{c['upstream_cx_total']} / {c['upstream_rq_total']} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--speed", action="store_true", help="price at the speed recorded around each")
    ap.add_argument("--per-sidecar", action="store_true", help="each topology sidecar apart")
    a = ap.parse_args()
    d = Path(a.dir)
    store = ProfileStore(a.db)
    readings = json.loads((d / "summary.json").read_text()).get("speed", []) if a.speed else []
    print(
        "| run | load | rate/s | app no mesh | app mesh | sidecars | mesh measured | mesh priced "
        "| one client | busy no mesh | busy mesh | ρ priced | ρ measured | steal |"
        + (" priced at speed now |" if a.speed else "")
    )
    print("|---" * (15 if a.speed else 14) + "|")
    for stem in STEMS:
        path = d / f"{stem}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        prof = store.get(doc["profile"])
        now: Speed | None = None
        if a.speed:
            got = [
                Speed.from_dict(r)
                for r in readings
                if "error" not in r and r["when"] in (f"before {stem}", f"after {stem}")
            ]
            now = typical(got) if got else None
            if now is not None and prof.speed is not None:
                f = ", ".join(f"{k} ×{v:.3f}" for k, v in kind_factors(now, prof.speed).items())
                print(f"<!-- {stem}: speed now / the profile's: {f} -->")
        plain = replace(prof, modes={m: replace(mp, capacity=None) for m, mp in prof.modes.items()})
        for pd in doc["tail"]["points"]:
            pairs = [
                (TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in pd["runs"]
            ]

            def med(f: Callable[[TailRun, TailRun], float], ps: Any = pairs) -> float:
                return statistics.median(f(b, m) for b, m in ps)

            app0 = med(lambda b, m: b.cpu_us_per_request("app"))
            app1 = med(lambda b, m: m.cpu_us_per_request("app"))
            sc = med(lambda b, m: m.cpu_us_per_request("sidecar"))
            busy0 = med(lambda b, m: b.cpu_ns["pods_busy"] / b.cpu_ns["pods_total"])
            busy1 = med(lambda b, m: m.cpu_ns["pods_busy"] / m.cpu_ns["pods_total"])
            steal = med(lambda b, m: m.cpu_ns.get("pods_steal", 0) / m.cpu_ns["pods_total"])
            rate = float(pd["rate"])
            opts = TailOptions(pod_cpus=1, app_cpu_us=app0, clients=32, load="pairs")
            b = _batch(d, stem, doc, float(pd["fraction"]), rate)
            work, rho = _mesh_price(b, prof, opts)
            work1, _ = _mesh_price(b, plain, opts)
            extra = ""
            if a.speed:
                ws = _mesh_price(b, prof, replace(opts, speed=now))[0] if now else float("nan")
                extra = f" {ws - app0:.0f} |"
            meas_rho = (sc + app1) * med(lambda b, m: m.achieved_qps) * 1e-6
            print(
                f"| {doc['tail']['topology']} | {pd['fraction']:.0%} | {rate:.0f} | {app0:.0f} | "
                f"{app1:.0f} | {sc:.0f} | {sc + app1 - app0:.0f} | {work - app0:.0f} | "
                f"{work1 - app0:.0f} | {busy0:.2f} | {busy1:.2f} | {rho:.2f} | {meas_rho:.2f} | "
                f"{steal:.3f} |{extra}"
            )
    for stem in STEMS[1:] if a.per_sidecar else ():
        if (d / f"{stem}.json").exists():
            doc = json.loads((d / f"{stem}.json").read_text())
            _sidecar_table(d, stem, doc, store.get(doc["profile"]))


if __name__ == "__main__":
    main()
