"""Runs fuzz cases in a child process: a case may hang or blow up memory, so the parent
(``run``) gives each one a time limit, kills a stuck child and starts another, and reads the
child's peak RSS after every case. The child runs the real entry points in-process (the CLI
through click for ECG, speedup, profile and option cases; the library API for configs and
traces) and classifies the outcome:

* ``ok``: a result, checked to be valid (every number in a prediction document finite);
* ``clean``: a :class:`~meshtax.errors.MeshtaxError` (or exit 2 from the CLI);
* ``traceback``: anything else, with the innermost meshtax frame for de-duplication.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fuzz.corpus import FIX, Case

TIME_LIMIT_S = 20.0
RSS_LIMIT_MIB = 1024
AS_LIMIT = 6 << 30  # address space of the child: a runaway allocation fails there, not here


@dataclass(frozen=True)
class Outcome:
    case: int
    target: str
    how: str
    kind: str  # ok, clean, traceback, hang, rss, crash
    detail: str
    seconds: float
    rss_mib: float


def _finite(doc: Any) -> str:
    """The first non-finite number of a result document ('' if none)."""
    stack = [(doc, "")]
    while stack:
        x, p = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return p or "(top)"
        if isinstance(x, dict):
            stack.extend((v, f"{p}.{k}") for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, f"{p}[{i}]") for i, v in enumerate(x[:10_000]))
    return ""


class Invalid(Exception):
    """A result that is not valid (e.g. a prediction with NaN)."""


class _Clean(Exception):
    """The CLI refused the input with exit status 2 (the message is kept for the report)."""


def _cli(args: list[str], cwd: Path) -> str:
    from meshtax import cli
    from meshtax.cli import _common

    _common._DEBUG[0] = True  # let unexpected exceptions through, for their location
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(args, standalone_mode=False)
        except SystemExit as e:
            if e.code not in (0, None, 1, 2):
                raise Invalid(f"exit {e.code}: {err.getvalue()[-300:]}") from None
            if e.code == 2:
                raise _Clean(err.getvalue().strip()[:200]) from None
        except Exception as e:
            import click

            if isinstance(e, click.exceptions.ClickException):
                raise _Clean(e.format_message()[:200]) from None  # click's own usage error
            raise
    text = err.getvalue()
    if "Traceback" in text:
        raise Invalid("a traceback was printed: " + text[-300:])
    out = cwd / "out.json"
    if out.exists():
        from meshtax import safeio

        bad = _finite(safeio.parse_json(out.read_text(), str(out)))
        if bad:
            raise Invalid(f"non-finite number in the result at {bad}")
    return "ok"


def _examples(d: Path) -> Path:
    from importlib import resources

    ex = d / "EX"
    ex.mkdir()
    src = resources.files("meshtax").joinpath("data/examples")
    for f in src.iterdir():
        if f.name.endswith(".yaml") and not f.name.startswith("speedup"):
            (ex / f.name).write_bytes(f.read_bytes())
    return ex


def t_ecg(c: Case, d: Path) -> str:
    p = d / c.name
    p.write_bytes(c.data)
    args = ["predict", str(p), "--profile", "reference", "--format", "json"]
    return _cli([*args, "-o", str(d / "out.json")], d)


def t_ecg_refs(c: Case, d: Path) -> str:
    shutil.copytree(FIX / "k8s" / "shop", d / "shop")
    shutil.copy(FIX / "envoy" / "bootstrap_http.yaml", d)
    return t_ecg(c, d)


def t_speedup(c: Case, d: Path) -> str:
    ex = _examples(d)
    p = d / c.name
    p.write_bytes(c.data)
    args = ["predict", str(ex / "bookinfo.yaml"), "--profile", "reference", "--speedup", str(p)]
    return _cli([*args, "--format", "json", "-o", str(d / "out.json")], d)


def t_profile(c: Case, d: Path) -> str:
    p = d / c.name
    p.write_bytes(c.data)
    db = str(d / "p.db")
    _cli(["profiles", "import", str(p), "--db", db, "--name", "fz"], d)
    ex = _examples(d)
    args = ["predict", str(ex / "bookinfo.yaml"), "--profile", "fz", "--db", db]
    return _cli([*args, "--format", "json", "-o", str(d / "out.json")], d)


def t_envoy(c: Case, d: Path) -> str:
    from meshtax.traces.envoy_config import sidecar_from_envoy

    p = d / c.name
    p.write_bytes(c.data)
    sidecar_from_envoy(p).report()
    return "ok"


def t_k8s(c: Case, d: Path) -> str:
    from meshtax.traces.k8s import sidecars_from_k8s

    shutil.copytree(FIX / "k8s" / "shop", d / "shop")
    (d / "shop" / c.name).write_bytes(c.data)
    imp = sidecars_from_k8s(d / "shop")
    imp.report(), imp.to_ecg_services_yaml()
    return "ok"


def _predict_batch(batch: Any) -> None:
    import numpy as np

    from meshtax.predict.engine import predict_batch
    from meshtax.store.reference import reference_profile

    prof = reference_profile()
    bp = predict_batch(batch, lambda name: prof)
    for name in ("latency_us", "cpu_vcpu"):
        v = getattr(bp, name, None)
        if v is not None and not np.isfinite(np.asarray(v, dtype=float)).all():
            raise Invalid(f"prediction {name} not finite")


def t_traces(c: Case, d: Path) -> str:
    from meshtax.traces import detect_format, load_traces

    p = d / c.name
    p.write_bytes(c.data)
    fmt = detect_format(p)
    res = load_traces([p], fmt)
    _predict_batch(res.batch)
    return "ok"


def t_alibaba(c: Case, d: Path) -> str:
    from meshtax.traces import AlibabaOptions, ingest, load_traces, open_store

    p = d / c.name
    p.write_bytes(c.data)
    fmt = "alibaba-v2022" if "v2022" in c.name else "alibaba-v2021"
    res = load_traces([p], fmt)
    _predict_batch(res.batch)
    # and through a store, bucketed (small buckets: the two-pass path)
    opts = AlibabaOptions(bucket_bytes=64 << 10)
    ingest([p], d / "store", fmt, opts, progress=False)
    for b in open_store(d / "store"):
        _predict_batch(b)
    return "ok"


def t_cli(c: Case, d: Path) -> str:
    _examples(d)
    (d / "OUT").mkdir()
    args = [
        a.replace("EX", str(d / "EX")).replace("OUT", str(d / "OUT")) for a in json.loads(c.data)
    ]
    return _cli(args, d)


TARGETS: dict[str, Callable[[Case, Path], str]] = {
    "ecg": t_ecg,
    "ecg_refs": t_ecg_refs,
    "speedup": t_speedup,
    "profile": t_profile,
    "envoy": t_envoy,
    "k8s": t_k8s,
    "traces": t_traces,
    "alibaba": t_alibaba,
    "cli": t_cli,
}


def _where(e: BaseException) -> str:
    """``Type at file:line (function)`` of the innermost frame inside meshtax."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/meshtax/" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(e.__traceback__)[-1]
    short = f.filename.split("/src/", 1)[-1]
    return f"{e.__class__.__name__} at {short}:{f.lineno} ({f.name})"


def _run_one(c: Case, scratch: str) -> tuple[str, str]:
    from meshtax.errors import MeshtaxError

    d = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
    printed = io.StringIO()
    unraisable: list[str] = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(
        _where(u.exc_value) if u.exc_value is not None else repr(u)
    )
    try:
        with contextlib.redirect_stderr(printed):
            kind = TARGETS[c.target](c, d)
        if unraisable:
            return "traceback", "printed: Exception ignored: " + unraisable[0]
        if "Traceback" in printed.getvalue():
            return "traceback", "printed a traceback: " + printed.getvalue()[-200:]
        return kind, ""
    except MeshtaxError as e:
        return "clean", str(e)[:200]
    except _Clean as e:
        return "clean", str(e)
    except Invalid as e:
        return "traceback", f"invalid result: {e}"
    except RecursionError as e:
        return "traceback", _where(e)
    except Exception as e:
        return "traceback", _where(e) + f": {str(e)[:120]}"
    finally:
        sys.unraisablehook = old_hook
        shutil.rmtree(d, ignore_errors=True)


def _child(conn: Any, scratch: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    os.environ["MESHTAX_DB"] = str(Path(scratch) / "p.db")
    tempfile.tempdir = scratch  # whatever the code under test makes goes there too
    import meshtax.cli  # noqa: F401  (imports once, not in the first case's time)

    while True:
        msg = conn.recv()
        if msg is None:
            return
        t0 = time.perf_counter()
        try:
            kind, detail = _run_one(msg, scratch)
        except MemoryError:
            kind, detail = "rss", "MemoryError"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        conn.send((kind, detail, time.perf_counter() - t0, rss))


class Runner:
    """Cases in a child process with a time limit each; a new child after a hang, a crash or
    an RSS peak over the limit (so every case is measured from a clean start)."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None
        self.conn: Any = None
        # one scratch directory for every child, removed by close(): a killed child (hang,
        # memory) cannot clean up after itself
        self.scratch = tempfile.mkdtemp(prefix="meshtax-fuzz-")

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_child, args=(child, self.scratch), daemon=True)
        self.proc.start()
        self.conn = parent

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(10)
            self.proc = None

    def run(self, i: int, c: Case) -> Outcome:
        if self.proc is None:
            self._start()
        self.conn.send(c)
        t0 = time.perf_counter()
        if not self.conn.poll(TIME_LIMIT_S + 30):  # + the child's start-up (imports)
            self._stop()
            return Outcome(i, c.target, c.how, "hang", "", time.perf_counter() - t0, 0.0)
        try:
            kind, detail, secs, rss = self.conn.recv()
        except (EOFError, OSError):
            self._stop()
            return Outcome(i, c.target, c.how, "crash", "child died", time.perf_counter() - t0, 0)
        if secs > TIME_LIMIT_S:
            kind, detail = "hang", f"{secs:.1f} s"
        if rss > RSS_LIMIT_MIB:
            kind, detail = "rss", f"peak RSS {rss:.0f} MiB"
        if kind in ("rss", "hang"):
            self._stop()
        return Outcome(i, c.target, c.how, kind, detail, secs, rss)

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.conn.send(None)
                self.proc.join(10)
            self._stop()
        shutil.rmtree(self.scratch, ignore_errors=True)
