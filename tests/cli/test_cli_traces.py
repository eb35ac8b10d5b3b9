"""CLI over traces, the study and configuration import (real files, tmp dirs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from meshtax.cli import main

FIX = Path(__file__).parents[1] / "traces" / "fixtures"
ALIBABA = Path(__file__).parents[3] / "shared" / "data" / "alibaba"


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {"MESHTAX_DB": str(tmp_path / "p.db")}


def invoke(args: list[str], env: dict[str, str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, args, env=env)


def test_predict_from_traces_same_for_jaeger_otlp_zipkin(env: dict[str, str]) -> None:
    docs = []
    for f in ("trace.jaeger.json", "trace.otlp.json", "trace.zipkin.json"):
        r = invoke(
            ["predict", "--traces", str(FIX / f), "--profile", "reference", "--format", "json"], env
        )
        assert r.exit_code == 0, r.output
        docs.append(json.loads(r.stdout))
    key = [
        (
            d["graphs"][0]["latency_overhead_us"]["value"],
            d["graphs"][0]["cpu_vcpu"]["value"],
            d["graphs"][0]["critical_path"],
        )
        for d in docs
    ]
    assert key[0] == key[1] == key[2]
    assert docs[0]["import"]["format"] == "jaeger" and docs[2]["import"]["format"] == "zipkin"


def test_predict_from_alibaba_sample_reports_import(env: dict[str, str]) -> None:
    f = ALIBABA / "v2021-sample.csv.gz"
    if not f.exists():
        pytest.skip(f"shared Alibaba sample not found at {f}")
    r = invoke(["predict", "--traces", str(f), "--profile", "reference", "--format", "json"], env)
    assert r.exit_code == 0, r.output
    # stdout only: a prediction that takes over 2 s (a loaded machine) reports its progress on
    # stderr, which Click's ``output`` interleaves
    doc = json.loads(r.stdout)
    imp = doc["import"]
    assert imp["graphs_seen"] == 17 and imp["graphs_kept"] + imp["graphs_dropped"] == 17
    assert doc["summary"]["graphs"] == imp["graphs_kept"] > 0


def test_generate_import_study(env: dict[str, str], tmp_path: Path) -> None:
    csv = tmp_path / "g.csv"
    r = invoke(["traces", "generate", "--graphs", "300", "--out", str(csv), "--seed", "7"], env)
    assert r.exit_code == 0 and "wrote 300 graphs" in r.output, r.output
    store = tmp_path / "store"
    r = invoke(["traces", "import", str(csv), "--out", str(store)], env)
    assert r.exit_code == 0 and "300 kept" in r.output, r.output
    out = tmp_path / "study"
    r = invoke(
        [
            "study",
            str(store),
            "--out",
            str(out),
            "--profile",
            "reference",
            "--config",
            "t=tcp",
            "--config",
            "g=grpc",
        ],
        env,
    )
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["configs"] == ["t", "g"] and s["graphs"] == 300
    assert (
        s["stats"]["g"]["latency_overhead_us"]["mean"]
        > s["stats"]["t"]["latency_overhead_us"]["mean"]
        > 0
    )
    assert (out / "cdf.csv").exists() and (out / "summary.json").exists()
    bad = invoke(
        ["study", str(store), "--out", str(out), "--profile", "reference", "--config", "x=quic"],
        env,
    )
    assert bad.exit_code == 2 and "expected NAME=MODE" in bad.output
    bad = invoke(
        [
            "study",
            str(store),
            "--out",
            str(out),
            "--profile",
            "reference",
            "--config",
            "x=tcp+mtls1.1",
        ],
        env,
    )
    assert (
        bad.exit_code == 2
        and "tls_version '1.1': expected one of 1.2, 1.3 (write +mtls, +mtls1.2 or +mtls1.3)"
        in bad.output
    )


def test_study_config_names_the_tls_version() -> None:
    from meshtax.app.predict import parse_study_config as _study_config
    from meshtax.model.sidecar import Mode, SidecarConfig

    assert _study_config("a=tcp+mtls1.2") == (
        "a",
        SidecarConfig(Mode.TCP, (), True, tls_version="1.2"),
    )
    assert _study_config("b=http+lua+mtls") == ("b", SidecarConfig(Mode.HTTP, ("lua",), True))
    assert _study_config("c=grpc") == ("c", SidecarConfig(Mode.GRPC))


def test_config_from_envoy_and_k8s(env: dict[str, str]) -> None:
    r = invoke(
        [
            "config",
            "from-envoy",
            str(FIX / "envoy" / "bootstrap_grpc_mtls.json"),
            "--format",
            "json",
        ],
        env,
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (
        d["sidecar"]["mode"] == "grpc"
        and d["sidecar"]["mtls"] is True
        and "envoy.filters.http.jwt_authn" in d["unknown_filters"]
    )
    r = invoke(["config", "from-envoy", str(FIX / "envoy" / "not_envoy.yaml")], env)
    assert r.exit_code == 2 and "Traceback" not in r.output
    r = invoke(["config", "from-k8s", str(FIX / "k8s" / "shop"), "--ecg"], env)
    assert r.exit_code == 0 and r.output.count("sidecar:") >= 5
    # Istio's Bookinfo as published: no namespace label, so no sidecar, said; --injection
    bookinfo = str(FIX / "istio" / "bookinfo")
    r = invoke(["config", "from-k8s", bookinfo], env)
    assert r.exit_code == 0 and "--injection enabled" in r.output
    r = invoke(["config", "from-k8s", bookinfo, "--injection", "enabled"], env)
    assert r.exit_code == 0 and r.output.count("http +istio-default mTLS") == 4
    r = invoke(["config", "from-k8s", bookinfo, "--injection", "sometimes"], env)
    assert r.exit_code == 2


def test_ecg_may_reference_envoy_config_and_k8s_manifests(
    env: dict[str, str], tmp_path: Path
) -> None:
    ecg = tmp_path / "g.yaml"
    ecg.write_text(f"""
sidecars_from_k8s: {FIX / "k8s" / "shop"}
services:
  frontend: {{}}
  cart: {{}}
  edge: {{sidecar: {{from_envoy: {FIX / "envoy" / "bootstrap_http.yaml"}}}}}
invocations:
  - {{id: r, callee: edge, duration_us: 1000}}
  - {{id: a, parent: r, callee: frontend, start_us: 10, duration_us: 500}}
  - {{id: b, parent: a, callee: cart, start_us: 20, duration_us: 100}}
""")
    r = invoke(["predict", str(ecg), "--profile", "reference", "--format", "json"], env)
    # the manifests are outside the ECG's directory: refused unless allowed
    assert r.exit_code == 2 and "--allow-outside" in r.output
    r = invoke(
        ["predict", str(ecg), "--profile", "reference", "--format", "json"]
        + ["--allow-outside", str(FIX)],
        env,
    )
    # the reference profile has no filter models: the imported chains must reach the engine
    assert (
        r.exit_code == 2
        and "no http-mode model for filter" in r.output
        and "rate_limit" in r.output
    )


def test_predict_traces_from_directory_glob_stdin_compressed(
    env: dict[str, str], tmp_path: Path
) -> None:
    import gzip

    import zstandard

    raw = (FIX / "trace.otlp.json").read_bytes()
    d = tmp_path / "traces"
    d.mkdir()
    (d / "a.json.gz").write_bytes(gzip.compress(raw))
    (d / "b.json.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    base = ["--profile", "reference", "--format", "json"]
    values = []
    for args, stdin in (
        ([str(d)], None),
        ([str(d / "*.zst")], None),
        (["-"], gzip.compress(raw)),
    ):
        r = CliRunner().invoke(main, ["predict", "--traces", *args, *base], env=env, input=stdin)
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["import"]["graphs_kept"] == 1
        values.append(doc["graphs"][0]["latency_overhead_us"]["value"])
    assert values[0] == values[1] == values[2]
    r = invoke(["traces", "import", str(d), "--out", str(tmp_path / "store")], env)
    assert r.exit_code == 0 and "1 kept" in r.output, r.output
