"""Issue #15, case by case: the inputs a careless or hostile user gives, each refused with one
clear line (exit 2) naming the file, the field and what was expected; a bug is one line and
exit 70. Risky cases (FIFOs, bombs) run the CLI in a subprocess with a timeout."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import meshtax
from meshtax.cli import main
from meshtax.store.reference import reference_profile

FIX = Path(__file__).resolve().parents[1] / "traces" / "fixtures"
BOOKINFO_SERVICES = "services: {a: {}, b: {}}\n"
ECG = BOOKINFO_SERVICES + "invocations:\n  - {id: r, callee: a, duration_us: 100}\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"MESHTAX_DB": str(tmp_path / "profiles.db")}


def run(args: list[str], env: dict[str, str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, args, env=env)


def cli(args: list[str], tmp: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real entry point in a child process (a case that blocks cannot block the suite)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(meshtax.__file__).resolve().parents[1]),
        "MESHTAX_DB": str(tmp / "profiles.db"),
    }
    return subprocess.run(
        [sys.executable, "-m", "meshtax.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp,
    )


def one_clean_error(r: subprocess.CompletedProcess[str] | object, *words: str) -> None:
    code = getattr(r, "returncode", getattr(r, "exit_code", None))
    out = getattr(r, "stdout", "") + getattr(r, "stderr", "") or getattr(r, "output", "")
    assert code == 2, out
    assert "Traceback" not in out
    for w in words:
        assert w in out, out


def test_an_unexpected_exception_is_one_line_and_exit_70(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ecg = tmp_path / "g.yaml"
    ecg.write_text(ECG)

    def boom(*a: object, **k: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("meshtax.cli.predict.predict_files", boom)
    monkeypatch.setattr("meshtax.cli._common._DEBUG", [False])
    r = run(["predict", str(ecg), "--profile", "reference"], env)
    assert r.exit_code == 70
    assert "internal error: ZeroDivisionError: a bug" in r.output
    assert "run with --debug for the traceback" in r.output
    assert "Traceback" not in r.output
    r = run(["--debug", "predict", str(ecg), "--profile", "reference"], env)
    assert isinstance(r.exception, ZeroDivisionError)  # --debug lets it through


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-100", "0", "1e308", "fast"])
def test_rate_must_be_finite_and_positive(env: dict[str, str], tmp_path: Path, value: str) -> None:
    ecg = tmp_path / "g.yaml"
    ecg.write_text(ECG)
    r = run(["predict", str(ecg), "--profile", "reference", f"--rate={value}"], env)
    one_clean_error(r, "--rate")


def test_not_regular_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "g.yaml"
    os.mkfifo(fifo)
    one_clean_error(cli(["predict", str(fifo), "--profile", "reference"], tmp_path), "FIFO")
    one_clean_error(cli(["predict", "/dev/zero", "--profile", "reference"], tmp_path), "device")
    r = cli(["predict", "--traces", str(fifo), "--profile", "reference"], tmp_path)
    one_clean_error(r, "FIFO")
    r = cli(["profiles", "import", str(fifo)], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_size_limit_and_raising_it(env: dict[str, str], tmp_path: Path) -> None:
    sparse = tmp_path / "big.yaml"
    with open(sparse, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB, no disk used
    r = run(["predict", str(sparse), "--profile", "reference"], env)
    one_clean_error(r, "3.0 GiB", "limit", "--max-input-mb")
    ecg = tmp_path / "g.yaml"
    ecg.write_text(ECG)
    r = run(["--max-input-mb", "0.00001", "predict", str(ecg), "--profile", "reference"], env)
    one_clean_error(r, "limit")
    assert (
        run(["--max-input-mb", "1", "predict", str(ecg), "--profile", "reference"], env).exit_code
        == 0
    )


def test_yaml_alias_bomb_and_deep_nesting(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "a: &a [x,x,x,x,x,x,x,x,x]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n"
            for i in range(9)
        )
    )
    one_clean_error(cli(["predict", str(bomb), "--profile", "reference"], tmp_path, 20), "alias")
    one_clean_error(cli(["config", "from-envoy", str(bomb)], tmp_path, 20), "alias")
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 200_000 + "]" * 200_000)  # libyaml's own composer dies on this
    one_clean_error(cli(["predict", str(deep), "--profile", "reference"], tmp_path, 20), "deep")


def test_one_service_with_two_sidecars_in_two_files(env: dict[str, str], tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("services: {s: {sidecar: tcp}}\ninvocations: [{id: r, callee: s}]\n")
    b.write_text("services: {s: {sidecar: http}}\ninvocations: [{id: r, callee: s}]\n")
    r = run(["predict", str(a), str(b), "--profile", "reference"], env)
    one_clean_error(r, "two different sidecar configurations")


def test_ecg_references_stay_in_the_ecg_directory(env: dict[str, str], tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "shadow").write_text("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n")
    d = tmp_path / "ecg"
    d.mkdir()
    for ref in ("../secret/shadow", str(secret / "shadow")):
        ecg = d / "g.yaml"
        ecg.write_text(
            f"services: {{a: {{sidecar: {{from_envoy: {json.dumps(ref)}}}}}}}\n"
            "invocations: [{id: r, callee: a}]\n"
        )
        r = run(["predict", str(ecg), "--profile", "reference"], env)
        one_clean_error(r, "outside the ECG file's directory", "--allow-outside")
        assert "$6$" not in r.output
        # allowed, it is read; what it holds is never quoted
        r = run(
            ["predict", str(ecg), "--profile", "reference", "--allow-outside", str(secret)], env
        )
        assert r.exit_code == 2 and "Traceback" not in r.output
        assert "$6$" not in r.output and "hashhash" not in r.output and "19000" not in r.output


def test_envoy_and_manifest_errors_do_not_quote_the_file(tmp_path: Path) -> None:
    f = tmp_path / "conf.yaml"
    f.write_text("password_is: hunter2hunter2\napi_key: 'sk-0123456789'\n")
    r = cli(["config", "from-envoy", str(f)], tmp_path)
    one_clean_error(r, "not an Envoy configuration")
    assert "hunter2" not in r.stderr and "password" not in r.stderr and "sk-01" not in r.stderr
    f.write_text("key: 'an unterminated secret value\n  more: [\n")
    r = cli(["config", "from-envoy", str(f)], tmp_path)
    one_clean_error(r, "YAML syntax error")
    assert "unterminated secret" not in r.stderr


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (
            ["modes", "tcp", "components", "other", "latency", "intercept"],
            "NaN",
            "intercept",
        ),
        (
            ["modes", "tcp", "components", "other", "latency", "intercept"],
            -500.0,
            "total latency",
        ),
        (["modes", "tcp", "components", "other", "cpu", "slope"], "Infinity", "slope"),
        (["modes", "tcp", "components", "other", "cpu", "rate_lo"], 5.0, "rate_lo"),
        (["platform", "cores"], "two", "platform.cores"),
    ],
)
def test_profile_import_refuses_bad_numbers_naming_the_field(
    env: dict[str, str], tmp_path: Path, path: list[str], value: object, field: str
) -> None:
    doc = reference_profile().to_dict()
    doc["name"] = "imported"
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    if path[-1] == "rate_lo":
        cur["rate_hi"] = 1.0  # an inverted range
    f = tmp_path / "p.json"
    text = json.dumps(doc).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
    f.write_text(text)
    r = run(["profiles", "import", str(f)], env)
    one_clean_error(r, field)
    assert run(["profiles", "show", "imported"], env).exit_code == 2  # nothing was stored


@pytest.mark.parametrize("factor", [".nan", ".inf", "-.inf", "1e400", "-200%", "[1]"])
def test_speedup_factors_must_be_finite(env: dict[str, str], tmp_path: Path, factor: str) -> None:
    ecg, sp = tmp_path / "g.yaml", tmp_path / "s.yaml"
    ecg.write_text(ECG)
    sp.write_text(f"name: x\nscale: {{ipc: {factor}}}\n")
    r = run(["predict", str(ecg), "--profile", "reference", "--speedup", str(sp)], env)
    one_clean_error(r, "scale.ipc")


def test_alibaba_gzip_bomb_and_corrupt_gzip(tmp_path: Path) -> None:
    header = b"traceid,timestamp,rpcid,um,rpctype,dm,interface,rt\n"
    row = b"T1,0,0,USER,http,A,x,5\n"
    (tmp_path / "bomb.csv.gz").write_bytes(gzip.compress(header + row * 8_000_000, 9))
    r = cli(["predict", "--traces", "bomb.csv.gz", "--profile", "reference"], tmp_path, 60)
    one_clean_error(r, "decompression bomb")
    good = gzip.compress(header + row * 1000)
    (tmp_path / "cut.csv.gz").write_bytes(good[: len(good) // 2])
    r = cli(["predict", "--traces", "cut.csv.gz", "--profile", "reference"], tmp_path)
    one_clean_error(r, "corrupt or truncated gzip")


def test_huge_alibaba_rt_is_dropped_not_priced(tmp_path: Path) -> None:
    header = b"traceid,timestamp,rpcid,um,rpctype,dm,interface,rt\n"
    rows = b"T1,0,0,USER,http,A,x,5\nT1,1,0.1,A,rpc,B,x,1e308\n"
    (tmp_path / "t.csv").write_bytes(header + rows)
    r = cli(
        ["predict", "--traces", "t.csv", "--profile", "reference", "--format", "json"], tmp_path
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "rt beyond" in json.dumps(doc["import"])
