"""``meshtax predict --percentiles / --sweep-rate`` end to end on the bundled examples, with a
profile that has a measured capacity and latency distributions."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from meshtax.cli import main
from meshtax.model.capacity import Capacity, CapacityPoint, LatencySketch
from meshtax.model.components import OTHER
from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import ProfileStore
from tests.helpers import flat, profile

PROBS = tuple(float(p) for p in np.linspace(0.0, 1.0, 11))


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    """A database holding ``fake``: 20 µs / 30 CPU-µs per crossing in every mode, two workers
    measured, and a latency sketch whose overhead grows from 20 to 120 µs per request."""
    base = profile({m: {OTHER: flat(20, 30)} for m in Mode}, name="fake")
    sk = LatencySketch(
        100, PROBS, tuple(100 + 20 + 100 * p**3 for p in PROBS), tuple(100.0 for _ in PROBS), 1000
    )
    cap = Capacity(15_000.0, 100, 32, 2, 60.0, "sidecar", 30_000.0, 2)
    modes = {
        m: replace(mp, capacity=cap, latency_sketches={100: sk}) for m, mp in base.modes.items()
    }
    db = tmp_path / "p.db"
    ProfileStore(str(db)).save(replace(base, modes=modes))
    return {"MESHTAX_DB": str(db)}


#: the ramp's sidecar CPU per request (both crossings) at every rate, against the models' 60
RAMP_US = 150.0


@pytest.fixture()
def ramp_env(tmp_path: Path) -> dict[str, str]:
    """A database holding ``fake`` (as ``env``) and ``ramp``: the same models, and a capacity
    ramp whose sidecar used :data:`RAMP_US` CPU-µs a request at 500 and at 5 000/s."""
    base = profile({m: {OTHER: flat(20, 30)} for m in Mode}, name="ramp")
    pts = tuple(CapacityPoint(r, r, r * RAMP_US * 1e-6, 0.9) for r in (500.0, 5000.0))
    cap = Capacity(15_000.0, 100, 32, 2, 60.0, "shared-cpu", 30_000.0, 1, pts)
    modes = {m: replace(mp, capacity=cap) for m, mp in base.modes.items()}
    db = tmp_path / "r.db"
    store = ProfileStore(str(db))
    store.save(replace(base, modes=modes))
    store.save(replace(base, name="fake"))
    return {"MESHTAX_DB": str(db)}


@pytest.fixture()
def bookinfo(tmp_path: Path) -> str:
    r = CliRunner().invoke(main, ["example", "--dest", str(tmp_path / "ex")])
    assert r.exit_code == 0, r.output
    return str(tmp_path / "ex" / "bookinfo.yaml")


def run(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(
        main, ["predict", *args, "--profile", "fake", "--samples", "400"], env=env
    )


def test_percentiles_json(bookinfo: str, env: dict[str, str]) -> None:
    r = run([bookinfo, "--rate", "2000", "--percentiles", "50,90,99", "--format", "json"], env)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    t = doc["tail"]
    assert t["percentiles"] == [50.0, 90.0, 99.0] and t["request_rate"] == 2000
    o = t["pooled"]["overhead_us"]
    assert 0 < o["p50"] < o["p90"] < o["p99"]
    for p in ("p50", "p90", "p99"):
        assert t["pooled"]["lo_us"][p] <= o[p] <= t["pooled"]["hi_us"][p]
    # product has 6 crossings per request at 30 CPU-µs on its two workers: ρ = 0.18
    st = {s["name"]: s for s in t["stations"]}
    assert st["product"]["servers"] == 2
    assert st["product"]["utilisation"] == pytest.approx(2000 * 6 * 30e-6 / 2)
    assert t["saturation"]["first"] == "product"
    assert t["saturation"]["rate"] == pytest.approx(0.8 / (6 * 30e-6 / 2), rel=1e-3)
    # the engine's mean prediction is unchanged by the tail options
    args = ["predict", bookinfo, "--profile", "fake", "--rate", "2000", "--format", "json"]
    plain = json.loads(CliRunner().invoke(main, args, env=env).output)
    assert doc["graphs"][0]["latency_overhead_us"] == plain["graphs"][0]["latency_overhead_us"]
    assert doc["options"]["tail"]["percentiles"] == [50.0, 90.0, 99.0]


def test_text_names_the_first_sidecar_to_saturate(bookinfo: str, env: dict[str, str]) -> None:
    r = run([bookinfo, "--rate", "12800", "--percentiles", "50,90,99"], env)
    assert r.exit_code == 0, r.output
    assert "Tail latency at 12800 requests/s" in r.output
    assert "First to saturate: product" in r.output
    assert "saturated" in r.output  # product at ρ = 1.15: its queue grows without bound


def test_sweep_rate_csv_marks_the_knee(bookinfo: str, env: dict[str, str]) -> None:
    r = run([bookinfo, "--sweep-rate", "1000:9000:5", "--format", "csv"], env)
    assert r.exit_code == 0, r.output
    text = r.output
    sweep = text[text.index("rate,percentile") :]
    rows = list(csv.DictReader(io.StringIO(sweep)))
    assert {row["rate"] for row in rows} == {"1000", "3000", "5000", "7000", "9000"}
    p99 = [float(row["overhead_us"]) for row in rows if row["percentile"] == "p99"]
    assert p99 == sorted(p99)  # more load, more overhead
    knees = [row["rate"] for row in rows if row["knee"] == "1"]
    # product (180 CPU-µs per request on two workers) reaches 0.8 at 8 889/s
    assert set(knees) == {"9000"}


def test_sweep_rate_auto_json_and_report(
    bookinfo: str, env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "r.html"
    r = run([bookinfo, "--sweep-rate", "--format", "json", "--report", str(out)], env)
    assert r.exit_code == 0, r.output
    s = json.loads(r.output[: r.output.rindex("}") + 1])["tail_sweep"]
    assert len(s["rates"]) == 12 and s["knee"]["station"] == "product"
    assert max(s["rates"]) < s["knee"]["saturation_rate"]
    html = out.read_text()
    assert "Latency overhead against load" in html and "<svg" in html


def test_shared_cpus_price_the_sidecars_from_the_ramp_as_the_validation_does(
    bookinfo: str, ramp_env: dict[str, str]
) -> None:
    args = [bookinfo, "--rate", "500", "--percentiles", "50,90", "--pod-cpus", "1"]
    r = CliRunner().invoke(
        main,
        ["predict", *args, "--profile", "ramp", "--samples", "100", "--format", "json"],
        env=ramp_env,
    )
    assert r.exit_code == 0, r.output
    t = json.loads(r.stdout)["tail"]
    assert t["pricing"]["used"] and t["pricing"]["scale"] == pytest.approx(RAMP_US / 60)
    # each sidecar side of a call costs the ramp's 150 CPU-µs, not the models' 2 × 30
    st = {s["name"]: s for s in t["stations"]}
    sides = sum(s["jobs_per_s"] for n, s in st.items() if n != "shared CPUs") / 2
    assert st["shared CPUs"]["utilisation"] == pytest.approx(sides * RAMP_US * 1e-6, rel=1e-6)
    text = CliRunner().invoke(
        main, ["predict", *args, "--profile", "ramp", "--samples", "100"], env=ramp_env
    )
    assert "Ramp price used: the sidecars on the shared CPUs cost" in text.output
    # its ramp keeps no latency quantiles: no queue bound, and the text says why
    assert t["queue_bound"].startswith("not used: the profile has no capacity ramp with latency")
    assert "Queue bound not used: the profile has no capacity ramp" in text.output
    # a profile without a ramp says so, and keeps the models' price
    r = CliRunner().invoke(
        main, ["predict", *args, "--profile", "fake", "--samples", "100"], env=ramp_env
    )
    assert r.exit_code == 0, r.output
    assert "Ramp price not used: the profile has no capacity ramp for http mode" in r.output


def test_the_markdown_and_html_reports_say_how_the_tail_was_priced(
    bookinfo: str, ramp_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "r.html"
    args = [bookinfo, "--rate", "500", "--percentiles", "50,90", "--pod-cpus", "1"]
    r = CliRunner().invoke(
        main,
        ["predict", *args, "--profile", "ramp", "--samples", "100", "--format", "markdown"]
        + ["--report", str(out)],
        env=ramp_env,
    )
    assert r.exit_code == 0, r.output
    assert "## Tail latency under load" in r.stdout
    assert "- Ramp price used: the sidecars on the shared CPUs cost" in r.stdout
    assert "<p>Ramp price used: the sidecars on the shared CPUs cost" in out.read_text()
    sweep = [bookinfo, "--sweep-rate", "100:400:2", "--pod-cpus", "1", "--format", "markdown"]
    r = CliRunner().invoke(
        main, ["predict", *sweep, "--profile", "ramp", "--samples", "100"], env=ramp_env
    )
    assert r.exit_code == 0, r.output
    assert "priced from the capacity ramp, × 2.50–2.50 the cost models' price" in r.stdout


def test_a_sweep_records_the_ramps_factor_at_each_rate(
    bookinfo: str, ramp_env: dict[str, str]
) -> None:
    args = [bookinfo, "--sweep-rate", "100:400:2", "--pod-cpus", "1", "--format", "json"]
    r = CliRunner().invoke(
        main, ["predict", *args, "--profile", "ramp", "--samples", "100"], env=ramp_env
    )
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["tail_sweep"]
    assert s["ramp_scale"] == pytest.approx([RAMP_US / 60] * 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--percentiles", "50,abc"], "expected numbers"),
        (["--percentiles", "100"], "within (0, 100)"),
        (["--sweep-rate", "9:1:3"], "0 < LO < HI"),
        (["--sweep-rate", "1:inf:3"], "0 < LO < HI"),
        (["--sweep-rate", "1:9:100000"], "N ≤ 200"),
        (["--threshold", "0.5"], "needs --percentiles or --sweep-rate"),
        (["--percentiles", "99", "--threshold", "nan"], "finite number"),
        (["--percentiles", "99", "--threshold", "1"], "0 < threshold < 1"),
        (["--percentiles", "99", "--app-cpu-us", "inf"], "finite number"),
        (["--percentiles", "99", "--workers", "100000"], "--workers"),
    ],
)
def test_bad_tail_options_are_refused(
    bookinfo: str, env: dict[str, str], args: list[str], message: str
) -> None:
    r = run([bookinfo, *args], env)
    assert r.exit_code == 2 and message in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "rate", "--levels", "abc"], "expected percentages"),
        (["--sweep", "rate", "--levels", "0,50"], "in (0, 1.5]"),
        (["bookinfo", "--levels", "25,200"], "in (0, 1.5]"),
        (["--levels", "50"], "give a TOPOLOGY"),
    ],
)
def test_bad_validation_levels_are_refused_before_anything_runs(
    env: dict[str, str], args: list[str], message: str
) -> None:
    r = CliRunner().invoke(main, ["validate", *args], env=env)
    assert r.exit_code == 2 and message in r.output, r.output
