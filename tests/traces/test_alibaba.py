"""Alibaba v2021/v2022 readers: real samples, exact small cases, malformed input, fuzzing."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshtax.traces.alibaba import AlibabaOptions, TraceFormatError, iter_alibaba
from meshtax.traces.api import load_traces
from meshtax.traces.report import ImportReport

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba"
H21 = "traceid,timestamp,rpcid,um,rpctype,dm,interface,rt\n"


def _need(name: str) -> Path:
    p = SAMPLES / name
    if not p.exists():
        pytest.skip(f"Alibaba sample {p} not present (shared data folder absent)")
    return p


def _balanced(r: ImportReport) -> None:
    assert r.rows_read == r.rows_used + r.rows_merged + sum(r.dropped_rows.values())
    assert r.graphs_seen == r.graphs_kept + r.graphs_dropped


def _parents_first(b) -> None:  # type: ignore[no-untyped-def]
    rows = np.arange(b.n_invocations)
    assert np.all(b.parent < rows)
    g = b.graph_of()
    has = b.parent >= 0
    assert np.all(g[b.parent[has]] == g[has])


@pytest.mark.parametrize("name", ["v2021-sample.csv.gz", "v2022-sample.csv.gz"])
@pytest.mark.parametrize("orphans", ["attach", "drop-rows", "drop-graph"])
def test_real_samples_import_with_report(name: str, orphans: str) -> None:
    res = load_traces(_need(name), options=AlibabaOptions(orphans=orphans))  # type: ignore[arg-type]
    r = res.report
    _balanced(r)
    assert r.graphs_kept == res.batch.n_graphs > 0
    assert r.rows_used == res.batch.n_invocations
    _parents_first(res.batch)
    assert np.all(res.batch.duration_us >= 0) and np.all(res.batch.start_us >= 0)
    if orphans == "attach":  # nothing dropped: broken traces are repaired and the repairs counted
        assert r.graphs_dropped == 0 and r.notes
    else:
        assert r.graphs_dropped > 0 and r.dropped_rows


def test_v2021_sample_numbers() -> None:
    r = load_traces(_need("v2021-sample.csv.gz")).report
    assert (r.rows_read, r.graphs_seen) == (
        967,
        17,
    )  # the data README says 966; the file has 967 data lines (no final newline)


def test_v2022_sample_numbers() -> None:
    r = load_traces(_need("v2022-sample.csv.gz")).report
    assert (r.rows_read, r.graphs_seen) == (1000, 196)  # README: 999; the file has 1000 data lines


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_v2021_exact_small_trace(tmp_path: Path) -> None:
    # caller (rt 10) and callee (rt -9) lines of 0.1 merge; 0.1.1 has no callee-side line;
    # 0.1.2 is a memcached call to two servers (two calls); 0.2.1's parent 0.2 is missing.
    text = (
        H21
        + "\n".join(
            [
                "T1,1000,0,,http,A,i,20",
                "T1,1001,0.1,A,rpc,B,i,10",
                "T1,1001,0.1,(?),rpc,B,i,-9",
                "T1,1002,0.1.1,B,rpc,C,i,5",
                "T1,1003,0.1.2,B,mc,M1,i,0",
                "T1,1003,0.1.2,B,mc,M2,i,0",
                "T1,1005,0.2.1,A,rpc,D,i,3",
                "T1,1005,0.3,A,rpc,E,i,abc",
                "T2,1000,x.1,A,rpc,B,i,1",
            ]
        )
        + "\n"
    )
    r = load_traces(_write(tmp_path, text), "alibaba-v2021")
    b, rep = r.batch, r.report
    assert rep.rows_read == 9
    assert rep.rows_merged == 1
    assert rep.dropped_rows == {"non-numeric rt": 1, "malformed rpcid": 1}
    assert rep.dropped_graphs == {"no usable rows": 1}
    assert rep.notes["parent rpcid missing: attached to nearest logged ancestor"] == 1
    assert b.n_graphs == 1 and b.n_invocations == 6
    names = [b.services[i] for i in b.callee]
    assert names[0] == "A" and sorted(names[1:]) == ["B", "C", "D", "M1", "M2"]
    callee = {b.services[b.callee[i]]: i for i in range(6)}
    assert b.parent[callee["D"]] == callee["A"]  # attached to "0"
    assert b.parent[callee["C"]] == callee["B"]
    assert b.caller[callee["A"]] == -1  # entry call from outside
    assert b.duration_us[callee["B"]] == 10_000.0  # caller-side rt, ms → µs
    assert b.start_us[callee["D"]] == 5_000.0


def test_v2022_duplicates_and_markers(tmp_path: Path) -> None:
    text = (
        "timestamp,traceid,service,rpc_id,rpctype,um,uminstanceid,interface,dm,dminstanceid,rt\n"
        "10,T,S,0,http,USER,USER,i,MS_1,P,7.0\n"
        "10,T,S,0,http,USER,USER,i,MS_1,P,7.0\n"
        "11,T,S,0.1,http,MS_1,P,i,MS_2,P,4.0\n"
        "11,T,S,0.1,http,UNKNOWN,UNAVAILABLE,i,MS_2,P,3.0\n"
        "12,T,S,0.1.1,rpc,UNAVAILABLE,UNAVAILABLE,i,UNKNOWN,P,1.0\n"
    )
    r = load_traces(_write(tmp_path, text))
    b = r.batch
    assert r.report.rows_merged == 2 and b.n_invocations == 3
    assert [b.services[i] for i in b.callee] == ["MS_1", "MS_2", "(unknown)"]
    assert b.caller.tolist() == [-1, b.services.index("MS_1"), b.services.index("MS_2")]
    assert b.duration_us.tolist() == [7000.0, 4000.0, 1000.0]


def test_bucketed_streaming_equals_in_memory(tmp_path: Path) -> None:
    src = _need("v2021-sample.csv.gz")
    one = load_traces(src).batch
    rep = ImportReport("x", "alibaba-v2021")
    parts = list(
        iter_alibaba(src, None, AlibabaOptions(bucket_bytes=20_000, partition_graphs=3), rep)
    )
    assert len(parts) > 3  # several buckets and partitions
    by_name = {}
    for b in parts:
        for g, name in enumerate(b.graph_names):
            lo, hi = b.graph_ptr[g], b.graph_ptr[g + 1]
            by_name[name] = sorted(
                zip(
                    b.start_us[lo:hi],
                    b.duration_us[lo:hi],
                    [b.services[i] for i in b.callee[lo:hi]],
                )
            )
    assert len(by_name) == one.n_graphs
    for g, name in enumerate(one.graph_names):
        lo, hi = one.graph_ptr[g], one.graph_ptr[g + 1]
        assert by_name[name] == sorted(
            zip(
                one.start_us[lo:hi],
                one.duration_us[lo:hi],
                [one.services[i] for i in one.callee[lo:hi]],
            )
        )


def test_wrong_columns(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot tell the trace format"):
        load_traces(_write(tmp_path, "a,b,c\n1,2,3\n"), None)
    with pytest.raises(TraceFormatError, match="neither Alibaba"):
        iter_alibaba(_write(tmp_path, "a,b,c\n1,2,3\n", "x.csv")).__next__()
    with pytest.raises(TraceFormatError, match="missing column"):
        load_traces(_write(tmp_path, "traceid,timestamp,um\nT,1,A\n"), "alibaba-v2021")


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="empty"):
        load_traces(_write(tmp_path, ""), "alibaba-v2021")
    r = load_traces(_write(tmp_path, H21, "h.csv"), "alibaba-v2021")
    assert r.batch.n_graphs == 0 and r.report.rows_read == 0


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress((H21 + "T,1,0,,http,A,i,1\n" * 20000).encode())
    p = tmp_path / "t.csv.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="truncated"):
        load_traces(p, "alibaba-v2021")


def test_rows_with_wrong_field_count_are_counted(tmp_path: Path) -> None:
    r = load_traces(_write(tmp_path, H21 + "T,1,0,,http,A,i,1\nT,2,0.1\n"), "alibaba-v2021")
    assert r.report.dropped_rows["wrong number of fields"] == 1 and r.batch.n_invocations == 1


rpcids = st.lists(st.integers(0, 3), min_size=0, max_size=4).map(
    lambda xs: ".".join(["0", *map(str, xs)])
)
cells = st.one_of(
    st.sampled_from(["", "(?)", "NAN", "UNKNOWN", "A", "B", "C"]), st.text("AB?(", max_size=3)
)
rts = st.one_of(
    st.integers(-50, 50).map(str), st.sampled_from(["", "abc", "1e3", "nan", "-0", "2.5"])
)
rows = st.tuples(
    st.sampled_from(["T1", "T2", "T3", ""]),
    st.integers(0, 9).map(str),
    st.one_of(rpcids, st.sampled_from(["0..1", "x", ""])),
    cells,
    st.sampled_from(["rpc", "mc", "http", "db"]),
    cells,
    rts,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(rows, max_size=30), st.sampled_from(["attach", "drop-rows", "drop-graph"]))
def test_fuzz_rows_never_crash_and_balance(
    tmp_path_factory: pytest.TempPathFactory, rs: list[tuple[str, ...]], orphans: str
) -> None:
    p = tmp_path_factory.mktemp("fz") / "f.csv"
    p.write_text(
        H21
        + "".join(f"{t},{ts},{rid},{um},{ty},{dm},i,{rt}\n" for t, ts, rid, um, ty, dm, rt in rs)
    )
    r = load_traces(p, "alibaba-v2021", AlibabaOptions(orphans=orphans))  # type: ignore[arg-type]
    _balanced(r.report)
    _parents_first(r.batch)
    assert np.all(np.isfinite(r.batch.duration_us))
