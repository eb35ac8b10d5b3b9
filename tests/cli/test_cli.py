from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pytest
from click.testing import CliRunner

from meshtax.cli import main

if TYPE_CHECKING:
    from meshtax.app.measure import MeasureOptions


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {"MESHTAX_DB": str(tmp_path / "p.db")}


@pytest.fixture()
def examples(tmp_path: Path) -> Path:
    r = CliRunner().invoke(main, ["example", "--dest", str(tmp_path / "ex")])
    assert r.exit_code == 0, r.output
    return tmp_path / "ex"


def invoke(args: list[str], env: dict[str, str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, args, env=env)


def test_example_writes_every_bundled_file(examples: Path) -> None:
    # the speedup file goes to whatif/, where `predict ex/*.yaml` does not pick it up
    assert [p.name for p in (examples / "whatif").iterdir()] == ["speedup-paper.yaml"]
    assert sorted(p.name for p in examples.glob("*.yaml")) == sorted(
        [
            "bookinfo.yaml",
            "online-boutique-index.yaml",
            "online-boutique-browse-product.yaml",
            "online-boutique-view-cart.yaml",
            "hotel-reservation-user.yaml",
            "hotel-reservation-search.yaml",
            "hotel-reservation-reservation.yaml",
        ]
    )


def test_predict_bookinfo_json(examples: Path, env: dict[str, str]) -> None:
    r = invoke(
        ["predict", str(examples / "bookinfo.yaml"), "--profile", "reference", "--format", "json"],
        env,
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["format"] == "meshtax-prediction/1" and doc["tool"]["name"] == "meshtax"
    assert (
        doc["profile"]["source"] == "published" and doc["profile"]["platform_is_this_host"] is False
    )
    assert any("different platform" in w for w in doc["warnings"])
    (g,) = doc["graphs"]
    # http: 82.585 µs per crossing; client→frontend 2 crossings, then 3 meshed hops of 4 on the path
    assert g["latency_overhead_us"]["value"] == pytest.approx(165.17 * 7)
    assert g["critical_path"] == [
        "client→frontend",
        "frontend→product",
        "product→reviews",
        "reviews→ratings",
    ]
    assert doc["options"]["profile"] == "reference"


def test_predict_table_says_platform_differs(examples: Path, env: dict[str, str]) -> None:
    r = invoke(["predict", str(examples / "bookinfo.yaml"), "--profile", "reference"], env)
    assert r.exit_code == 0
    assert "NOT this host" in r.output and "critical path" in r.output


def test_predict_csv_and_distribution(examples: Path, env: dict[str, str]) -> None:
    files = [str(p) for p in sorted(examples.glob("*.yaml"))]
    r = invoke(["predict", *files, "--profile", "reference", "--format", "csv"], env)
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[0].startswith("graph,base_latency_us,latency_overhead_us") and len(lines) == 8
    t = invoke(["predict", *files, "--profile", "reference"], env)
    assert "distribution over 7 graphs" in t.output


def test_predict_speedup(examples: Path, env: dict[str, str]) -> None:
    sp = examples / "all.yaml"
    sp.write_text("name: half\nscale: {all: -50%}\n")
    r = invoke(
        [
            "predict",
            str(examples / "bookinfo.yaml"),
            "--profile",
            "reference",
            "--speedup",
            str(sp),
            "--format",
            "json",
        ],
        env,
    )
    w = json.loads(r.stdout)["whatif"]
    assert w["after"]["cpu_vcpu_total"] == pytest.approx(w["before"]["cpu_vcpu_total"] / 2)
    assert w["saving"]["cpu_saving_fraction"] == pytest.approx(0.5)


def test_readme_whatif_example_saves_on_the_reference(examples: Path, env: dict[str, str]) -> None:
    # the README's example: ipc -30 %, write -50 %, parsing -20 % on Table 2's HTTP column
    args = ["predict", str(examples / "bookinfo.yaml"), "--profile", "reference"]
    args += ["--speedup", str(examples / "whatif" / "speedup-paper.yaml")]
    r = invoke([*args, "--format", "json"], env)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert not [w for w in doc["warnings"] if "changes nothing" in w]
    w = doc["whatif"]
    per_sidecar_us = 0.3 * 12.73 + 0.5 * 13.57 + 0.2 * 122.07  # per request through one
    saved = w["before"]["latency_overhead_us"]["mean"] - w["after"]["latency_overhead_us"]["mean"]
    assert saved == pytest.approx(7 * per_sidecar_us)  # seven sidecar passes on the path
    per_sidecar_vcpu = 0.3 * 0.50 + 0.5 * 0.49 + 0.2 * 6.07
    assert w["saving"]["cpu_saving_fraction"] == pytest.approx(per_sidecar_vcpu / 9.70)
    text = invoke(args, env)
    assert "saving" in text.output and "changes nothing" not in text.output


def test_whatif_derive_writes_a_file_predict_takes(
    examples: Path, env: dict[str, str], tmp_path: Path
) -> None:
    from meshtax.model.components import IPC, OTHER, PARSING
    from meshtax.model.sidecar import Mode
    from tests.helpers import flat, profile

    def put(name: str, ipc: float) -> None:
        comps = {IPC: flat(ipc, ipc), PARSING: flat(20, 20), OTHER: flat(10, 10)}
        p = profile({Mode.HTTP: comps}, name=name)
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(p.to_dict()))
        assert invoke(["profiles", "import", str(f)], env).exit_code == 0

    put("tcp-ipc", 10.0)
    put("uds-ipc", 4.0)
    out = tmp_path / "uds.yaml"
    r = invoke(["whatif", "derive", "tcp-ipc", "uds-ipc", "-o", str(out)], env)
    assert r.exit_code == 0, r.output
    assert "ipc" in r.output and "×0.400" in r.output
    args = ["predict", str(examples / "bookinfo.yaml"), "--profile", "tcp-ipc", "--format", "json"]
    doc = json.loads(invoke([*args, "--speedup", str(out)], env).output)
    w = doc["whatif"]
    assert w["speedup"] == "http: ipc -60%"
    saved = w["before"]["latency_overhead_us"]["mean"] - w["after"]["latency_overhead_us"]["mean"]
    assert saved == pytest.approx(14 * 6.0)  # 14 crossings on the critical path, 6 µs each
    r = invoke(["whatif", "derive", "tcp-ipc", "reference", "-o", str(out)], env)
    assert r.exit_code == 2 and "different hosts" in r.output


def test_predict_without_profile_of_this_host_explains(examples: Path, env: dict[str, str]) -> None:
    r = invoke(["predict", str(examples / "bookinfo.yaml")], env)
    assert r.exit_code == 2
    assert "no profile of this machine" in r.output and "--profile reference" in r.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("services: {a: {}}\ninvocations: [{callee: b}]\n", "unknown service 'b'"),
        ("{", "YAML syntax error"),
    ],
)
def test_bad_ecg_is_a_clear_error_not_a_traceback(
    tmp_path: Path, env: dict[str, str], content: str, message: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(content)
    r = invoke(["predict", str(f), "--profile", "reference"], env)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_bad_speedup_and_unknown_profile(examples: Path, env: dict[str, str]) -> None:
    sp = examples / "bad-speedup.yaml"
    sp.write_text("scale: {ipc: fast}\n")
    r = invoke(
        [
            "predict",
            str(examples / "bookinfo.yaml"),
            "--profile",
            "reference",
            "--speedup",
            str(sp),
        ],
        env,
    )
    assert r.exit_code == 2 and "expected a percent change" in r.output
    r = invoke(["predict", str(examples / "bookinfo.yaml"), "--profile", "nope"], env)
    assert r.exit_code == 2 and "no profile named 'nope'" in r.output


def test_profiles_export_import_show(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "ref.json"
    assert invoke(["profiles", "export", "reference", "-o", str(out)], env).exit_code == 0
    r = invoke(["profiles", "import", str(out), "--name", "copy"], env)
    assert r.exit_code == 0, r.output
    lst = invoke(["profiles", "list", "--format", "json"], env)
    assert [p["name"] for p in json.loads(lst.output)] == ["reference", "copy"]
    show = invoke(["profiles", "show", "copy"], env)
    assert "165.17" in show.output and "41.09" in show.output and "191.67" in show.output
    assert "13.36" in show.output
    csv = invoke(["profiles", "show", "copy", "--format", "csv"], env)
    assert csv.output.splitlines()[0].startswith("profile,mode,component,metric")
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": 1}')
    r = invoke(["profiles", "import", str(bad)], env)
    assert r.exit_code == 2 and "not a usable profile" in r.output


def test_real_entry_point_runs(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "meshtax.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.startswith("meshtax, version ")


def test_predict_writes_report_and_markdown(
    examples: Path, env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "r.html"
    r = invoke(
        [
            "predict",
            str(examples / "bookinfo.yaml"),
            "--profile",
            "reference",
            "--format",
            "markdown",
            "--report",
            str(out),
        ],
        env,
    )
    assert r.exit_code == 0, r.output
    assert r.output.startswith("# meshtax prediction")
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "bookinfo" in html


def test_report_command(examples: Path, env: dict[str, str], tmp_path: Path) -> None:
    pred = tmp_path / "p.json"
    assert (
        invoke(
            [
                "predict",
                str(examples / "bookinfo.yaml"),
                "--profile",
                "reference",
                "--format",
                "json",
                "-o",
                str(pred),
            ],
            env,
        ).exit_code
        == 0
    )
    out = tmp_path / "rep.html"
    r = invoke(
        [
            "report",
            str(pred),
            "--profiles",
            "reference",
            "--compare",
            "reference",
            "reference",
            "-o",
            str(out),
        ],
        env,
    )
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 10_000
    bad = invoke(["report", str(tmp_path / "missing.json"), "-o", str(out)], env)
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert invoke(["report", "-o", str(out)], env).exit_code == 2


def test_profile_refuses_without_root_and_bad_modes(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    r = invoke(["profile", "--modes", "quic"], env)
    if os.geteuid() == 0:
        assert r.exit_code == 2 and "'quic' is not a valid Mode" in r.output
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = invoke(["profile", "--quick"], env)
    assert r.exit_code == 2 and "run it as root" in r.output


def test_validate_refuses_without_root_and_bad_modes(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    if os.geteuid() == 0:
        r = invoke(["validate", "bookinfo", "--modes", "quic"], env)
        assert r.exit_code == 2 and "--modes" in r.output
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = invoke(["validate", "bookinfo"], env)
    assert r.exit_code == 2 and "run it as root" in r.output


def test_predict_pod_cpus_bounds_latency_by_cpu_work(examples: Path, env: dict[str, str]) -> None:
    f = str(examples / "online-boutique-view-cart.yaml")
    own = json.loads(
        invoke(
            ["predict", f, "--profile", "reference", "--rate", "100", "--format", "json"], env
        ).output
    )
    r = invoke(
        [
            "predict",
            f,
            "--profile",
            "reference",
            "--rate",
            "100",
            "--pod-cpus",
            "1",
            "--format",
            "json",
        ],
        env,
    )
    assert r.exit_code == 0, r.output
    one = json.loads(r.stdout)
    (g0,), (g1,) = own["graphs"], one["graphs"]
    # one shared CPU: every crossing's CPU work (CPU-µs per request) is on the path
    work_us = g1["cpu_vcpu"]["value"] / 100 * 1e6
    assert g1["latency_overhead_us"]["value"] == pytest.approx(
        max(work_us, g0["latency_overhead_us"]["value"])
    )
    assert (
        g1["latency_overhead_us"]["value"] > g0["latency_overhead_us"]["value"]
    )  # parallel calls serialize
    assert sum(s["latency_on_path_us"] for s in g1["by_service"]) == pytest.approx(
        g1["latency_overhead_us"]["value"]
    )
    assert (
        one["placement"]["pod_cpus"] == 1
        and one["options"]["pod_cpus"] == 1
        and "placement" not in own
    )
    assert invoke(["predict", f, "--profile", "reference", "--pod-cpus", "0"], env).exit_code == 2


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--proxy", "refsidecar", "--modes", "tcp,http"], "runs tcp mode only, not http"),
        (["--write", "zerocopy"], "envoy has no zerocopy writes"),
        (["--proxy", "refsidecar", "--ipc", "sockmap", "--write", "zerocopy"], "do not compose"),
        (["--proxy", "linkerd"], "'linkerd' is not one of"),
        (["--proxy", "nginx", "--ipc", "uds"], "nginx has no ipc 'uds'"),
        (["--proxy", "refsidecar", "--zerocopy-min", "-1"], "--zerocopy-min"),
        (["--round-beds"], "(--round-beds) needs early rounds (--rounds 2 or more)"),
    ],
)
def test_profile_refuses_what_the_proxy_cannot_do_before_anything_runs(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 0)  # refused before any root-only step
    r = invoke(["profile", "--quick", *args], env)
    assert r.exit_code == 2 and said in r.output, r.output
    assert "Traceback" not in r.output


def _capture_measure(monkeypatch: pytest.MonkeyPatch) -> list[MeasureOptions]:
    """`meshtax profile` runs nothing: every MeasureOptions it would measure is kept."""
    from meshtax.app import measure as m
    from tests.helpers import profile

    seen: list[MeasureOptions] = []

    def fake_measure(opts: MeasureOptions, *a: object, **kw: object) -> m.Measured:
        seen.append(opts)
        return m.Measured(profile({}, name="N"), ())

    monkeypatch.setattr(m, "require_root", lambda what: None)
    monkeypatch.setattr(m, "measure", fake_measure)
    return seen


def test_profile_microarch_options_reach_the_extras(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`profile --microarch --filters … --base B --name N`: one extras run, named N."""
    seen = _capture_measure(monkeypatch)
    sym = tmp_path / "envoy.map"
    sym.write_text("0000000000001000 T main\n")
    args = ["profile", "--microarch", "--filters", "lua,tap", "--counters", "valgrind"]
    r = invoke([*args, "--symbol-map", str(sym), "--base", "B", "--name", "N"], env)
    assert r.exit_code == 0, r.output
    (o,) = seen
    assert o.base == "B" and o.extras is not None
    x = o.extras
    assert (x.microarch, x.counters, x.symbol_map, x.name) == (True, "valgrind", str(sym), "N")
    assert x.filters == ("lua", "tap")
    r = invoke(["profile", "--microarch", "--counters", "papi"], env)
    assert r.exit_code == 2 and "papi" in r.output


def test_profile_low_rate_repeats_reach_the_plan(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`profile --quick --low-rate-repeats 3`: three full-length pairs at 100/s; 0 is refused."""
    seen = _capture_measure(monkeypatch)
    r = invoke(["profile", "--quick", "--low-rate-repeats", "3"], env)
    assert r.exit_code == 0, r.output
    (o,) = seen
    assert o.profile.low_rate_repeats == 3
    assert o.profile.resolve_plan().low_rate_pairs(100.0) == (3, 0.8)
    r = invoke(["profile", "--quick", "--low-rate-repeats", "0"], env)
    assert r.exit_code == 2 and "--low-rate-repeats" in r.output


def test_validate_suite_maps_its_options(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`validate --suite [FILE] --out DIR …` → one SuiteOptions → validate_suite; a Ctrl-C
    says where the measured cases are and how to continue."""
    import os

    from meshtax.app import measure as m
    from meshtax.validate.suite_run import SuiteResult

    r = invoke(["validate", "--suite"], env)
    assert r.exit_code == 2 and "needs --out DIR" in r.output
    r = invoke(["validate", "bookinfo", "--suite", "--out", "d"], env)
    assert r.exit_code == 2 and "takes no TOPOLOGY" in r.output
    r = invoke(["validate"], env)
    assert (
        r.exit_code == 2
        and "give a TOPOLOGY (e.g. bookinfo), --sweep size|rate or --suite" in r.output
    )
    r = invoke(["validate", "--suite", "--out", "d", "--sets", "holdout,train"], env)
    assert r.exit_code == 2 and "--sets" in r.output
    seen: list[m.SuiteOptions] = []

    def fake(opts: m.SuiteOptions, store: object, say: object) -> SuiteResult:
        seen.append(opts)
        if opts.resume:
            raise KeyboardInterrupt
        return SuiteResult({"name": "s"}, {"calibration": (), "holdout": ()})

    monkeypatch.setattr(m, "validate_suite", fake)
    monkeypatch.setattr(m, "require_root", lambda what: None)
    out = str(tmp_path / "run")
    r = invoke(["validate", "--suite", "--out", out, "--quick", "--rate", "50"], env)
    assert r.exit_code == 0, r.output
    assert "# Validation suite `s`" in r.output
    args = ["validate", "--suite", "my.yaml", "--out", out, "--sets", "holdout"]
    more = ["--speed", "profile", "--order", "sets"]
    r = invoke([*args, "--resume", "--name", "p", "--accept-unclosed", *more], env)
    assert r.exit_code == 130 and "--resume continues" in r.output
    assert seen == [
        m.SuiteOptions(out, None, rate=50.0, quick=True),
        m.SuiteOptions(
            out,
            "my.yaml",
            ("holdout",),
            name="p",
            accept_unclosed=True,
            speed="profile",
            resume=True,
            order="sets",
        ),
    ]
    monkeypatch.undo()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = invoke(["validate", "--suite", "--out", out], env)
    assert r.exit_code == 2 and "run it as root" in r.output


def test_the_suite_orders_offered_are_the_suites_own() -> None:
    # the CLI spells them out (it does not import the validation at start-up): kept equal here
    from meshtax.cli.measure import validate
    from meshtax.validate.suite import ORDERS

    (order,) = [p for p in validate.params if p.name == "order"]
    assert isinstance(order.type, click.Choice)
    assert tuple(order.type.choices) == ORDERS and order.default == ORDERS[0]


def test_every_command_is_imported_from_the_modules_it_is_listed_with() -> None:
    import importlib

    from meshtax.cli._common import COMMANDS

    for module in {m for ms in COMMANDS.values() for m in ms}:
        importlib.import_module(f"meshtax.cli.{module}")
    assert set(main.commands) == set(COMMANDS)
    for name, cmd in main.commands.items():
        subs = getattr(cmd, "commands", {}).values()
        modules = {c.callback.__module__ for c in [cmd, *subs] if c.callback is not None}
        assert modules == {f"meshtax.cli.{m}" for m in COMMANDS[name]}, name
