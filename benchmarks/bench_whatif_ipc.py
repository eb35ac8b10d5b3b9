"""The paper's Figures 13/14 on this machine (issue #17): kernel IPC/write optimizations
measured per component, derived speedups, and the what-if study over Alibaba-like call graphs.

1. ``--measure`` (root): quick tcp-mode profiles (sizes 100 B, 4 KB, 64 KB; no carried
   protocols, no low rates) of the reference sidecar over loopback TCP, Unix sockets, TCP with
   ``MSG_ZEROCOPY`` (every send) and TCP under sockmap redirection, and of Envoy over loopback
   TCP, Unix sockets and sockmap — in ``--rounds`` interleaved rounds (every set-up once per
   round, so drift between profiles shows), into ``--db``, named ``<prefix>-<label>-r<round>``.
2. ``--graphs`` Alibaba-like call graphs (``meshtax traces generate``, ``--seed``), imported at
   100 B and 4 KB messages (``meshtax traces import --sidecar tcp``).
3. Per component, every variant next to its baseline at 100 B and 4 KB, latency and CPU with
   95 % intervals (the fitted models' ± 1.96 standard errors; ``components.md``/``.json``),
   and the paired end-to-end overhead each profile measured without probes.
4. The what-if study per proxy and round (:func:`meshtax.app.whatif.whatif_study`: derived
   speedup files applied over every graph; reductions of the mean overhead with intervals
   next to the paper's 27 % / 18 % and "negligible"), each round's variants against that
   round's baseline, and ``repeat``: the other round's baseline (the same set-up measured
   again: how far drift alone moves a profile) → ``whatif-<proxy>-r<round>/`` and
   ``report.html``.

Run under the machine's measurement lock (the profiles measure; the study keeps a CPU busy)::

    flock /run/meshtax-measure.lock .venv/bin/python benchmarks/bench_whatif_ipc.py \\
        --db artifacts/whatif/prof.db --out artifacts/whatif --measure
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.app import data as app_data
from meshtax.app.measure import MeasureOptions, ProfileOptions, measure
from meshtax.app.whatif import WhatifStudyOptions, whatif_study
from meshtax.model.components import IPC, NOTIFICATION, OTHER, READ, WRITE, Component
from meshtax.model.profile import Profile
from meshtax.model.proxy import ProxyChoice
from meshtax.model.sidecar import Mode
from meshtax.predict.whatif import Z95
from meshtax.profile.backends import Backends
from meshtax.store.sqlite import ProfileStore
from meshtax.traces import generate

#: label → the sidecar measured, in the order measured
PROFILES: dict[str, ProxyChoice] = {
    "rs-tcp": ProxyChoice("refsidecar"),
    "rs-uds": ProxyChoice("refsidecar", "uds"),
    "rs-zerocopy": ProxyChoice("refsidecar", write="zerocopy"),
    "rs-sockmap": ProxyChoice("refsidecar", "sockmap"),
    "envoy-tcp": ProxyChoice(),
    "envoy-uds": ProxyChoice("envoy", "uds"),
    "envoy-sockmap": ProxyChoice("envoy", "sockmap"),
}
#: proxy → (baseline label, {variant: label})
STUDIES: dict[str, tuple[str, dict[str, str]]] = {
    "refsidecar": (
        "rs-tcp",
        {"uds": "rs-uds", "zerocopy": "rs-zerocopy", "sockmap": "rs-sockmap"},
    ),
    "envoy": ("envoy-tcp", {"uds": "envoy-uds", "sockmap": "envoy-sockmap"}),
}
SIZES = (100.0, 4096.0)
COMPONENTS: tuple[Component, ...] = (IPC, WRITE, READ, NOTIFICATION, OTHER)


def run_profiles(store: ProfileStore, prefix: str, rounds: int, only: set[str]) -> dict[str, Any]:
    """Measure every profile of :data:`PROFILES` once per round (``only``: these labels); a
    failure is recorded and the next one measured."""
    log: dict[str, Any] = {}
    for r, (label, choice) in ((r, x) for r in range(1, rounds + 1) for x in PROFILES.items()):
        if only and label not in only:
            continue
        name = f"{prefix}-{label}-r{r}"
        label = f"{label}-r{r}"
        t0, load0 = time.monotonic(), os.getloadavg()
        popts = ProfileOptions(
            name=name,
            quick=True,
            modes=(Mode.TCP,),
            carried=(),
            low_rates=(),
            replace=True,
            proxy=choice,
        )
        try:
            done = measure(MeasureOptions(popts), store, backends=Backends(lock_timeout=3600.0))
            log[label] = {"name": name, "status": done.profile.status, "warnings": done.warnings}
        except Exception as e:  # noqa: BLE001 - one failed profile must not lose the others
            log[label] = {"name": name, "error": f"{e!r}", "trace": traceback.format_exc()}
        log[label] |= {
            "wall_s": time.monotonic() - t0,
            "load_before": list(load0),
            "load_after": list(os.getloadavg()),
        }
        print(f"{label}: {log[label].get('status', log[label].get('error'))}", file=sys.stderr)
    return log


def _value(p: Profile, c: Component, metric: str, size: float) -> dict[str, float] | None:
    m = p.modes[Mode.TCP].components.get(c)
    if m is None:
        return None
    model = getattr(m, metric)
    v = float(model.predict(np.array([size]))[0])
    se = float(model.stderr_at(np.array([size]))[0])
    return {"value": v, "lo": v - Z95 * se, "hi": v + Z95 * se, "se": se}


def _sum(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None or b is None:
        return None
    v, se = a["value"] + b["value"], float(np.hypot(a["se"], b["se"]))
    return {"value": v, "lo": v - Z95 * se, "hi": v + Z95 * se, "se": se}


def _overheads(p: Profile) -> dict[str, Any]:
    """The paired end-to-end overhead per crossing, without probes, at each size (µs)."""
    out = {}
    for r in p.provenance.options.get("measurements", {}).get("tcp", []):
        e = r.get("overhead_per_request_us")
        if e:
            out[str(r["size"])] = {k: e[k] / 2 for k in ("median", "lo", "hi")}
    return out


def _wakeups(p: Profile) -> dict[str, dict[str, float]]:
    """Wake-ups (returns from a sleeping epoll wait) per request in the kept probe windows, at
    each size: the sidecar's, and the app's on the meshed and on the direct path."""
    out = {}
    for r in p.provenance.options.get("measurements", {}).get("tcp", []):
        ws = [w for w in r["probe"]["windows"] if w["kept"]]

        def per(meshed: bool, who: str, ws: list[dict[str, Any]] = ws) -> float:
            sel = [w for w in ws if w["meshed"] == meshed]
            n = sum(w["requests"] for w in sel)
            return sum(w[who]["notify_n"] for w in sel) / n if n else float("nan")

        out[str(r["size"])] = {
            "sidecar": per(True, "sidecar"),
            "app_meshed": per(True, "app"),
            "app_direct": per(False, "app"),
        }
    return out


def components(store: ProfileStore, prefix: str, rounds: int) -> dict[str, Any]:
    """Every variant next to its baseline, per component, metric and size, round by round."""
    out: dict[str, Any] = {}
    stored = {s.name for s in store.list()}
    for proxy, (base_label, variants) in STUDIES.items():
        labels = [
            (lab, f"{v}-r{r}")
            for r in range(1, rounds + 1)
            for lab, v in {"tcp": base_label, **variants}.items()
        ]
        for label, vlabel in labels:
            name = f"{prefix}-{vlabel}"
            if name not in stored:
                continue
            label = f"{label} r{vlabel.rsplit('-r', 1)[1]}"
            p = store.get(name)
            rows: dict[str, Any] = {}
            for metric in ("latency", "cpu"):
                for size in SIZES:
                    vals = {c.key: _value(p, c, metric, size) for c in COMPONENTS}
                    vals["ipc+write"] = _sum(vals["ipc"], vals["write"])
                    rows[f"{metric} {size:g}"] = vals
            mp = p.modes[Mode.TCP]
            c = mp.closure
            out.setdefault(proxy, {})[label] = {
                "profile": p.name,
                "platform": p.platform.describe(),
                "status": p.status,
                "created": p.provenance.created,
                "components": rows,
                "overhead_per_crossing_us": _overheads(p),
                "wakeups_per_request": _wakeups(p),
                "closure": None
                if c is None
                else {"components": c.components_us, "measured": c.measured_us, "error": c.error},
                "interference": {k: v for k, v in p.interference.items() if k != "by_size"},
            }
    return out


def _cell(v: dict[str, float] | None) -> str:
    return "-" if v is None else f"{v['value']:.1f} [{v['lo']:.1f}, {v['hi']:.1f}]"


def markdown(comp: dict[str, Any]) -> str:
    """The per-component tables BENCHMARKS.md quotes."""
    lines = []
    for proxy, by_label in comp.items():
        labels = list(by_label)
        for key in ("latency 100", "latency 4096", "cpu 100", "cpu 4096"):
            metric, size = key.split()
            unit = "µs" if metric == "latency" else "CPU-µs"
            lines += [
                f"\n{proxy}, {metric} per crossing ({unit}) at {int(size)} B:\n",
                "| component | " + " | ".join(labels) + " |",
                "|---|" + "---:|" * len(labels),
            ]
            for c in (*(x.key for x in COMPONENTS), "ipc+write"):
                cells = [_cell(by_label[lab]["components"][key].get(c)) for lab in labels]
                lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines.append(
            "| measured overhead (paired, no probes) | "
            + " | ".join(
                "; ".join(
                    f"{s} B {o['median']:.1f} [{o['lo']:.1f}, {o['hi']:.1f}]"
                    for s, o in by_label[lab]["overhead_per_crossing_us"].items()
                )
                for lab in labels
            )
            + " |"
        )
        lines.append(
            "| wake-ups per request: sidecar / app meshed / app direct | "
            + " | ".join(
                "; ".join(
                    f"{s} B {w['sidecar']:.2f} / {w['app_meshed']:.2f} / {w['app_direct']:.2f}"
                    for s, w in by_label[lab]["wakeups_per_request"].items()
                )
                for lab in labels
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--prefix", default="w17")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--measure", action="store_true", help="measure the profiles first (root)")
    ap.add_argument(
        "--only", default="", help="with --measure: these labels only (comma-separated)"
    )
    ap.add_argument("--graphs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=17)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.db.parent.mkdir(parents=True, exist_ok=True)
    store = ProfileStore(str(a.db))
    doc: dict[str, Any] = {
        "options": {k: str(v) for k, v in vars(a).items()},
        "host": os.uname().release,
    }
    if a.measure:
        only = {s for s in a.only.split(",") if s}
        doc["profiles"] = run_profiles(store, a.prefix, a.rounds, only)
    comp = components(store, a.prefix, a.rounds)
    (a.out / "components.json").write_text(json.dumps(comp, indent=1))
    (a.out / "components.md").write_text(markdown(comp))
    csv = a.out / f"graphs-{a.graphs}-seed{a.seed}.csv.gz"
    if not csv.exists():
        generate(a.graphs, a.seed, "alibaba-v2021", csv)
    stores = {}
    for size in SIZES:
        sdir = a.out / f"store-{size:g}B"
        if not sdir.exists():
            app_data.import_traces(
                [str(csv)], str(sdir), None, "tcp", size, size, None, False, False
            )
        stores[size] = str(sdir)
    files = []
    t0 = time.monotonic()
    stored = {s.name for s in store.list()}
    for (proxy, (base_label, variants)), r in (
        (x, r) for x in STUDIES.items() for r in range(1, a.rounds + 1)
    ):
        base = f"{a.prefix}-{base_label}-r{r}"
        have = {k: f"{a.prefix}-{v}-r{r}" for k, v in variants.items()}
        have = {k: v for k, v in have.items() if v in stored}
        others = [f"{a.prefix}-{base_label}-r{q}" for q in range(1, a.rounds + 1) if q != r]
        if others and others[0] in stored:
            have["repeat"] = others[0]
        if base not in stored or not have:
            print(f"{proxy} round {r}: profiles missing, no study", file=sys.stderr)
            continue
        out = a.out / f"whatif-{proxy}-r{r}"
        opts = WhatifStudyOptions(
            stores,
            base,
            have,
            str(out),
            name=f"{proxy}, round {r}: Figures 13/14 on this machine",
            accept_unclosed=True,
            notes=(
                "'repeat' is the baseline's set-up measured in another round: the reduction a "
                "variant needs to exceed to be told from run-to-run drift",
            ),
        )
        w = whatif_study(opts, store, say=lambda m: print(m, file=sys.stderr))
        files.append(str(out / "whatif-study.json"))
        doc.setdefault("studies", {})[f"{proxy} r{r}"] = {
            v["label"] + f" {at['size']:g}": v["reduction_pct"]
            for at in w["sizes"]
            for v in at["variants"]
        }
    doc["study_s"] = time.monotonic() - t0
    names = sorted(n for n in stored if n.startswith(a.prefix + "-"))
    if files:
        app_data.build_report(files, names, store, str(a.out / "report.html"))
    (a.out / "bench_whatif_ipc.json").write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc.get("studies", {}), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
