"""fortio: argv building and JSON parsing (FakeSystem, checked-in fixtures), and real runs
against real fortio echo servers on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshtax.model.sidecar import Mode
from meshtax.testbed.fortio import (
    FortioError,
    FortioServer,
    LoadFailed,
    LoadSpec,
    access_log_latencies_us,
    beyond_histogram,
    check_result,
    exact_percentiles,
    fortio_binary,
    load_argv,
    measure_max_qps,
    parse_result,
    run_load,
    run_spec,
    server_argv,
)
from meshtax.testbed.system import Completed, FakeSystem, Placement, RealSystem, free_ports

FIX = Path(__file__).parent / "fixtures"
BIN = Path("/x/fortio")


def fixture(name: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads((FIX / name).read_text())
    return doc


COMMON = ["/x/fortio", "load", "-quiet", "-json", "-", "-c"]


@pytest.mark.parametrize(
    ("spec", "tail"),
    [
        (
            LoadSpec("127.0.0.1:8080", Mode.HTTP, 100, 0, n=1000),
            [
                "1",
                "-qps",
                "0",
                "-r",
                "1e-06",
                "-p",
                "50,90,99,99.9",
                "-timeout",
                "3s",
                "-n",
                "1000",
                "-payload-size",
                "100",
                "http://127.0.0.1:8080/echo",
            ],
        ),
        (
            LoadSpec("10.0.0.2:9080", Mode.GRPC, 4096, 500, connections=4, duration_s=2.5),
            [
                "4",
                "-qps",
                "500",
                "-r",
                "1e-06",
                "-p",
                "50,90,99,99.9",
                "-timeout",
                "3s",
                "-t",
                "2.5s",
                "-payload-size",
                "4096",
                "-grpc",
                "-ping",
                "10.0.0.2:9080",
            ],
        ),
        (
            LoadSpec("127.0.0.1:7", Mode.TCP, 0, 0, n=10, resolution_s=1e-7, percentiles=(50.0,)),
            [
                "1",
                "-qps",
                "0",
                "-r",
                "1e-07",
                "-p",
                "50",
                "-timeout",
                "3s",
                "-n",
                "10",
                "tcp://127.0.0.1:7",
            ],
        ),
        (
            LoadSpec("127.0.0.1:8080", Mode.HTTP, 1 << 20, 0, n=5),
            [
                "1",
                "-qps",
                "0",
                "-r",
                "1e-06",
                "-p",
                "50,90,99,99.9",
                "-timeout",
                "3s",
                "-n",
                "5",
                "-payload-size",
                "1048576",
                "-maxpayloadsizekb",
                "1025",
                "-httpbufferkb",  # the echo answers with the 1 MiB payload
                "1041",
                "http://127.0.0.1:8080/echo",
            ],
        ),
        (
            LoadSpec("http://127.0.0.1:8080/echo?status=503", Mode.HTTP, 0, 0, n=5),
            [
                "1",
                "-qps",
                "0",
                "-r",
                "1e-06",
                "-p",
                "50,90,99,99.9",
                "-timeout",
                "3s",
                "-n",
                "5",
                "http://127.0.0.1:8080/echo?status=503",
            ],
        ),
    ],
)
def test_load_argv(spec: LoadSpec, tail: list[str]) -> None:
    assert load_argv(spec, BIN) == COMMON + tail


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 10, "duration_s": 1.0},  # both
        {},  # neither
        {"n": 10, "resolution_s": 1e-3},  # fortio's default resolution misreports p50
        {"n": 10, "connections": 0},
        {"n": 10, "qps": -1.0},
    ],
)
def test_load_spec_rejects(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LoadSpec("127.0.0.1:1", **kwargs)  # type: ignore[arg-type]


def _slow_run(spec: LoadSpec, p50: float, p99: float) -> dict[str, object]:
    """fortio's JSON of 2 000 calls of 200–900 ms, percentiles in seconds as given."""
    h = {
        "Count": 2000, "Min": 0.2, "Max": 0.893, "Avg": 0.515, "StdDev": 0.1,
        "Percentiles": [{"Percentile": 50, "Value": p50}, {"Percentile": 99, "Value": p99}],
    }  # fmt: skip
    return {"DurationHistogram": h, "RetCodes": {"200": 2000}}


def test_percentiles_beyond_the_histogram_are_named() -> None:
    """At 1 µs fortio's buckets stop at 100 ms: bench_meshes' percentiles of a 200 ms echo
    were 100 ms + p × (max − 100 ms), every one of them (issue #18). With ``-offset`` at the
    delay they are in the histogram again."""
    plain = LoadSpec("h:1", Mode.HTTP, 0, 400, duration_s=5)
    r = parse_result(_slow_run(plain, 0.4965, 0.8851), plain)  # envoy, intra, round 0
    assert beyond_histogram(r) == [50.0, 99.0]
    assert r.p50_us - 1e5 == pytest.approx((r.max_us - 1e5) * 0.5, rel=1e-3)
    offset = LoadSpec("h:1", Mode.HTTP, 0, 400, duration_s=5, offset_s=0.2)
    assert "-offset" not in load_argv(plain, BIN)
    assert load_argv(offset, BIN)[-5:-3] == ["-offset", "0.2s"]
    assert offset.to_dict()["offset_s"] == 0.2 and "offset_s" not in plain.to_dict()
    assert beyond_histogram(parse_result(_slow_run(offset, 0.2025, 0.2992), offset)) == []
    assert beyond_histogram(parse_result(_slow_run(offset, 0.2025, 0.3102), offset)) == [99.0]
    with pytest.raises(ValueError):
        LoadSpec("h:1", n=1, offset_s=-1.0)


def test_parse_http_ok() -> None:
    spec = LoadSpec("127.0.0.1:47080", Mode.HTTP, 100, 0, n=200)
    r = parse_result(fixture("fortio_http_ok.json"), spec)
    assert (r.count, r.errors, dict(r.ret_codes), r.sockets, r.version) == (
        200,
        0,
        {"200": 200},
        1,
        "1.68.2",
    )
    assert r.min_us == pytest.approx(25.599)
    assert r.max_us == pytest.approx(889.517)
    assert r.avg_us == pytest.approx(74.10521)
    assert r.p50_us == pytest.approx(47.10526315789473)
    assert r.p90_us == pytest.approx(102.85714285714284)
    assert r.p99_us == pytest.approx(700.0)
    assert r.actual_qps == pytest.approx(13425.884218665227)
    assert r.duration_s == pytest.approx(0.014896598)
    assert r.ok and check_result(r) is r


@pytest.mark.parametrize(
    ("name", "mode", "count", "p50"),
    [
        ("fortio_grpc_ok.json", Mode.GRPC, 200, 151.36363636363635),
        ("fortio_tcp_ok.json", Mode.TCP, 200, 64.13793103448276),
    ],
)
def test_parse_ok_modes(name: str, mode: Mode, count: int, p50: float) -> None:
    r = check_result(parse_result(fixture(name), LoadSpec("h:1", mode, 100, 0, n=count)))
    assert (r.count, r.errors) == (count, 0)
    assert r.p50_us == pytest.approx(p50)


@pytest.mark.parametrize(
    ("name", "mode", "needle"),
    [
        ("fortio_http_503.json", Mode.HTTP, "'503': 20"),
        ("fortio_tcp_refused.json", Mode.TCP, "connection refused"),
        # a gRPC ping result parsed as HTTP: its codes are not HTTP 200s
        ("fortio_grpc_ok.json", Mode.HTTP, "SERVING"),
    ],
)
def test_failed_calls_are_a_failed_measurement(name: str, mode: Mode, needle: str) -> None:
    r = parse_result(fixture(name), LoadSpec("h:1", mode, 0, 0, n=1))
    assert not r.ok
    with pytest.raises(LoadFailed, match=needle):
        check_result(r)


def test_zero_calls_is_a_failed_measurement() -> None:
    doc = fixture("fortio_tcp_ok.json")
    doc["DurationHistogram"] = {"Count": 0, "Min": 0, "Max": 0, "Avg": 0, "Percentiles": None}
    doc["RetCodes"] = {}
    with pytest.raises(LoadFailed, match="no calls"):
        check_result(parse_result(doc, LoadSpec("h:1", Mode.TCP, 0, 0, n=1)))


def _answer(stdout: str, rc: int = 0, stderr: str = "") -> FakeSystem:
    def responder(argv: tuple[str, ...]) -> Completed | None:
        return Completed(argv, rc, stdout, stderr) if "load" in argv else None

    return FakeSystem(responders=[responder])


def test_run_spec_places_and_parses() -> None:
    fake = _answer((FIX / "fortio_http_ok.json").read_text())
    r = run_load(
        "127.0.0.1:47080",
        "http",
        100,
        0,
        n=200,
        system=fake,
        place=Placement(netns="client", cpus=(0,)),
        binary=BIN,
    )
    assert r.count == 200
    assert fake.calls[0][:7] == ("ip", "netns", "exec", "client", "taskset", "-c", "0")
    assert fake.calls[0][7:9] == ("/x/fortio", "load")


def test_run_spec_failures() -> None:
    spec = LoadSpec("127.0.0.1:1", Mode.TCP, 10, 0, n=5)
    with pytest.raises(LoadFailed, match="exited 1: boom"):
        run_spec(spec, _answer("", rc=1, stderr="boom"), binary=BIN)
    with pytest.raises(FortioError, match="no JSON"):
        run_spec(spec, _answer("not json"), binary=BIN)
    with pytest.raises(LoadFailed, match="connection refused"):
        run_spec(spec, _answer((FIX / "fortio_tcp_refused.json").read_text()), binary=BIN)


def test_server_argv_disables_what_is_not_asked() -> None:
    argv = server_argv(BIN, "127.0.0.1", http_port=1, tcp_port=3)
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["-http-port"] == "127.0.0.1:1"
    assert pairs["-grpc-port"] == "disabled"
    assert pairs["-tcp-port"] == "127.0.0.1:3"
    assert pairs["-udp-port"] == pairs["-redirect-port"] == "disabled"
    assert pairs["-ui-path"] == ""


# ---- real fortio on loopback -------------------------------------------------------------


def _have_fortio() -> bool:
    try:
        fortio_binary()
    except FortioError:
        return False
    return True


real = pytest.mark.skipif(not _have_fortio(), reason="fortio not installed (scripts/install.sh)")


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Mode, int]]:
    http, grpc, tcp = free_ports(3)
    srv = FortioServer(
        RealSystem(),
        tmp_path_factory.mktemp("fortio"),
        http_port=http,
        grpc_port=grpc,
        tcp_port=tcp,
    )
    with srv:
        yield {Mode.HTTP: http, Mode.GRPC: grpc, Mode.TCP: tcp}
    assert srv.process is not None and srv.process.poll() is not None


@real
@pytest.mark.parametrize("mode", [Mode.HTTP, Mode.GRPC, Mode.TCP])
def test_real_echo_load(echo: dict[Mode, int], mode: Mode) -> None:
    r = run_load(f"127.0.0.1:{echo[mode]}", mode, 100, 0, n=200)
    assert (r.count, r.errors) == (200, 0)
    assert 0 < r.min_us <= r.p50_us <= r.p90_us <= r.p99_us <= r.max_us
    assert r.spec.resolution_s == 1e-6


@real
def test_real_fixed_rate_and_max_qps(echo: dict[Mode, int]) -> None:
    r = run_load(f"127.0.0.1:{echo[Mode.TCP]}", "tcp", 64, 200, duration_s=0.5)
    assert r.ok and 50 < r.actual_qps < 400
    assert measure_max_qps(f"127.0.0.1:{echo[Mode.TCP]}", "tcp", 64, duration_s=0.3) > 0


@real
@pytest.mark.parametrize("mode", [Mode.HTTP, Mode.GRPC, Mode.TCP])
def test_real_closed_port_fails(mode: Mode) -> None:
    (port,) = free_ports(1)
    with pytest.raises(LoadFailed):
        run_load(f"127.0.0.1:{port}", mode, 10, 0, n=5, timeout_s=1.0)


@real
def test_real_error_status_fails(echo: dict[Mode, int]) -> None:
    with pytest.raises(LoadFailed, match="503"):
        run_load(f"http://127.0.0.1:{echo[Mode.HTTP]}/echo?status=503", "http", 0, 0, n=5)


def test_http_buffer_fits_the_largest_response() -> None:
    def buf(spec: LoadSpec) -> list[str]:
        a = load_argv(spec, BIN)
        return (
            a[a.index("-httpbufferkb") : a.index("-httpbufferkb") + 2]
            if "-httpbufferkb" in a
            else []
        )

    assert buf(LoadSpec("h:1", Mode.HTTP, 100, 0, n=1, response_bytes=100_000)) == []
    assert buf(LoadSpec("h:1", Mode.HTTP, 100, 0, n=1, response_bytes=131_072)) == [
        "-httpbufferkb",
        "145",
    ]
    assert buf(LoadSpec("h:1", Mode.GRPC, 100, 0, n=1, response_bytes=131_072)) == []


@real
def test_real_response_above_the_fast_clients_buffer(echo: dict[Mode, int]) -> None:
    """A 150 kB response (a topology's entry page, say): fortio's fast HTTP client fails every
    other call with its default 128 KiB buffer; given the response size, none."""
    url = f"http://127.0.0.1:{echo[Mode.HTTP]}/echo?size=150000"
    with pytest.raises(LoadFailed):
        run_load(url, "http", 0, 0, n=6)
    assert run_load(url, "http", 0, 0, n=6, response_bytes=150_000).ok


def test_percentiles_from_the_access_log_not_the_buckets(tmp_path: Path) -> None:
    """Issue #18: at 1 µs resolution fortio's buckets are 1 ms wide from 1 to 5 ms, and a p50
    in ]1000, 2000] µs is interpolated across the bucket (requests at 1.15–1.25 ms read as
    ~1.5 ms). With an access log the percentiles are the requests' own."""
    doc = json.loads((FIX / "fortio_http_ok.json").read_text())
    n = int(doc["DurationHistogram"]["Count"])
    lat_s = [0.00115 + 0.0001 * i / (n - 1) for i in range(n)]  # 1150 … 1250 µs
    # what fortio's histogram says of them: one bucket ]1000, 2000], p50 in its middle
    doc["DurationHistogram"]["Data"] = [{"Start": 0.00115, "End": 0.002, "Count": n}]
    doc["DurationHistogram"]["Percentiles"] = [{"Percentile": 50, "Value": 0.001575}]
    log = tmp_path / "access.jsonl"

    def responder(argv: tuple[str, ...]) -> Completed | None:
        if "load" not in argv:
            return None
        path = Path(argv[argv.index("-access-log-file") + 1])
        assert argv[argv.index("-access-log-format") + 1] == "json"
        path.write_text(
            "".join(
                f'{{"latency":{s:f},"timestamp":{i},"thread":0,"ok":true,"details":"200"}}\n'
                for i, s in enumerate(lat_s)
            )
        )
        return Completed(argv, 0, json.dumps(doc), "")

    log.write_text('{"latency":9.0}\n')  # an old log: fortio appends, so it must go first
    spec = LoadSpec("h:1", Mode.HTTP, 0, 100.0, n=n, percentiles=(50.0, 90.0), access_log=str(log))
    r = run_spec(spec, FakeSystem(responders=[responder]), binary=BIN)
    assert r.percentiles_us[50.0] == pytest.approx(1200.0, abs=1.0)
    assert r.percentiles_us[90.0] == pytest.approx(1240.0, abs=1.0)
    assert not log.exists() and spec.to_dict()["percentiles_from"] == "access log"
    # without the log: the bucket's interpolation, 375 µs off
    plain = run_spec(
        LoadSpec("h:1", Mode.HTTP, 0, 100.0, n=n),
        FakeSystem(
            responders=[lambda a: Completed(a, 0, json.dumps(doc), "") if "load" in a else None]
        ),
        binary=BIN,
    )
    assert plain.p50_us == pytest.approx(1575.0)
    assert "-access-log-file" not in load_argv(LoadSpec("h:1", n=1), BIN)
    # a log that does not match the result is an error, not a silent mix
    lat_s = lat_s[:-1]
    with pytest.raises(FortioError, match="access log has"):
        run_spec(spec, FakeSystem(responders=[responder]), binary=BIN)
    assert exact_percentiles([3.0, 1.0, 2.0], (50.0,)) == {50.0: 2.0}
    assert access_log_latencies_us('{"latency":0.001500}\n\n') == [1500.0]


def test_a_failed_run_leaves_no_access_log_and_a_kept_log_gives_the_quantiles(
    tmp_path: Path,
) -> None:
    log = tmp_path / "access.jsonl"

    def failing(argv: tuple[str, ...]) -> Completed | None:
        if "load" not in argv:
            return None
        Path(argv[argv.index("-access-log-file") + 1]).write_text('{"latency":0.001}\n')
        return Completed(argv, 1, "", "connection refused")

    spec = LoadSpec("h:1", Mode.HTTP, 0, 100.0, n=1, access_log=str(log))
    with pytest.raises(LoadFailed):
        run_spec(spec, FakeSystem(responders=[failing]), binary=BIN)
    assert not log.exists()
    # a result with its requests' latencies: quantiles of those; without: of the histogram
    doc = json.loads((FIX / "fortio_http_ok.json").read_text())
    doc["DurationHistogram"]["Data"] = [{"Start": 0.001, "End": 0.002, "Count": 3}]
    plain = parse_result(doc, LoadSpec("h:1", n=3))
    assert plain.quantiles([0.5]) == pytest.approx([1500.0])
    kept = replace(plain, latencies_us=np.array([1100.0, 1200.0, 1300.0]))
    assert kept.quantiles([0.5, 1.0]) == pytest.approx([1200.0, 1300.0])
