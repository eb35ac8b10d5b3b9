"""Seeds and mutations of the fuzz suite: every input path of meshtax, made hostile.

Seeds are built at test time from the bundled examples, the test fixtures, a profile export,
and generated traces of every format (Jaeger, OTLP JSON, Zipkin, Alibaba v2021/v2022 plain and
gzip). A case is ``(target, name, data)``: ``data`` replaces the seed file's bytes; the
mutations are byte-level (truncation, flips, splices, empty, binary) and structural (a value
anywhere in a parsed document replaced by a wrong type, NaN/Infinity/1e308/negative, a huge
string, deep nesting, a duplicate id, a YAML alias bomb, gzip bombs and corrupt gzip).
Every mutation draws from one ``random.Random`` seeded per case: a failure is reproducible
from ``(seed, index)``.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

FIX = Path(__file__).resolve().parents[1] / "traces" / "fixtures"


@dataclass(frozen=True)
class Seed:
    target: str  # what reads it (see tests/fuzz/worker.py TARGETS)
    name: str  # file name (its suffix decides JSON vs YAML, .gz)
    data: bytes
    kind: str  # "yaml", "json", "csv", "gz" (how to mutate it structurally)


@dataclass(frozen=True)
class Case:
    target: str
    name: str
    data: bytes
    how: str  # the mutation, for the report


def _examples() -> list[Seed]:
    root = resources.files("meshtax").joinpath("data/examples")
    out = []
    for f in sorted(root.iterdir(), key=lambda t: t.name):
        if f.name.endswith(".yaml"):
            target = "speedup" if f.name.startswith("speedup") else "ecg"
            out.append(Seed(target, f.name, f.read_bytes(), "yaml"))
    return out


def _profile_seed() -> Seed:
    from meshtax.model.components import IPC, OTHER, PARSING, filter_component
    from meshtax.model.costmodel import ComponentModel, CostModel
    from meshtax.model.sidecar import Mode
    from tests.helpers import profile

    def fitted(a: float, b: float) -> CostModel:
        sizes = [100.0, 1000.0, 4000.0, 100.0, 1000.0, 4000.0]
        rates = [100.0, 100.0, 100.0, 1000.0, 1000.0, 1000.0]
        vals = [a + b * s + (0.3 if r < 500 else 0.0) for s, r in zip(sizes, rates)]
        return CostModel.fit(sizes, vals, rates=rates, split_bytes=16384)

    p = profile(
        {
            m: {
                IPC: ComponentModel(fitted(3.0, 0.001), fitted(2.0, 0.0005)),
                OTHER: ComponentModel(fitted(10.0, 0.002), fitted(8.0, 0.001)),
                PARSING: ComponentModel(fitted(40.0, 0.01), fitted(30.0, 0.01)),
                filter_component("lua"): ComponentModel(fitted(5.0, 0.0), fitted(4.0, 0.0)),
            }
            for m in (Mode.TCP, Mode.HTTP, Mode.GRPC)
        },
        name="fuzzed",
    )
    return Seed("profile", "profile.json", json.dumps(p.to_dict()).encode(), "json")


def _trace_seeds(tmp: Path) -> list[Seed]:
    from meshtax.traces import generate

    out = [
        Seed("traces", "trace.jaeger.json", (FIX / "trace.jaeger.json").read_bytes(), "json"),
        Seed("traces", "trace.otlp.json", (FIX / "trace.otlp.json").read_bytes(), "json"),
        Seed("traces", "trace.zipkin.json", (FIX / "trace.zipkin.json").read_bytes(), "json"),
    ]
    for v in ("v2021", "v2022"):
        p = tmp / f"g-{v}.csv"
        generate(12, 7, f"alibaba-{v}", str(p), broken_fraction=0.2)
        out.append(Seed("alibaba", p.name, p.read_bytes(), "csv"))
        out.append(Seed("alibaba", p.name + ".gz", gzip.compress(p.read_bytes()), "gz"))
    return out


def _config_seeds() -> list[Seed]:
    out = []
    for f in sorted((FIX / "envoy").iterdir()):
        kind = "json" if f.suffix == ".json" else "yaml"
        out.append(Seed("envoy", f.name, f.read_bytes(), kind))
    for f in sorted((FIX / "k8s" / "shop").rglob("*.yaml")):
        out.append(Seed("k8s", f.name, f.read_bytes(), "yaml"))
    return out


def _ref_ecg() -> Seed:
    """An ECG that references an Envoy config and manifests next to it (the target copies
    the referenced fixtures beside it)."""
    text = """
sidecars_from_k8s: shop
services:
  frontend: {}
  cart: {}
  edge: {sidecar: {from_envoy: bootstrap_http.yaml}}
invocations:
  - {id: r, callee: edge, duration_us: 1000}
  - {id: a, parent: r, callee: frontend, start_us: 10, duration_us: 500}
  - {id: b, parent: a, callee: cart, start_us: 20, duration_us: 100}
"""
    return Seed("ecg_refs", "refs.yaml", text.encode(), "yaml")


def seeds(tmp: Path) -> list[Seed]:
    return [
        *_examples(),
        _profile_seed(),
        *_trace_seeds(tmp),
        *_config_seeds(),
        _ref_ecg(),
        Seed("cli", "args.json", b"[]", "cli"),
    ]


# ---- mutations ------------------------------------------------------------------------------

HOSTILE: list[Any] = [
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    -1e308,
    -1,
    -100.5,
    0,
    10**30,
    True,
    None,
    "",
    "x" * 10_000,
    "ünïcødé ✓ \u202e",
    "-30%",
    "nan",
    [],
    {},
    [1, 2, 3],
    {"a": {"b": [None]}},
    "../../../etc/passwd",
    "/etc/shadow",
]


def _paths(doc: Any, limit: int = 5000) -> list[list[Any]]:
    """Paths to every value of a parsed document (iterative; at most ``limit``)."""
    out: list[list[Any]] = []
    stack: list[tuple[Any, list[Any]]] = [(doc, [])]
    while stack and len(out) < limit:
        x, p = stack.pop()
        out.append(p)
        if isinstance(x, dict):
            stack.extend((v, [*p, k]) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, [*p, i]) for i, v in enumerate(x))
    return out


def _set(doc: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


def _delete(doc: Any, path: list[Any]) -> Any:
    if not path:
        return None
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    del cur[path[-1]]
    return doc


def _dump(doc: Any, kind: str, rng: random.Random) -> bytes:
    try:
        if kind == "json":
            return json.dumps(doc, allow_nan=True).encode()
        try:
            return yaml.safe_dump(doc, allow_unicode=True, width=10_000).encode()
        except yaml.YAMLError:
            return json.dumps(doc, allow_nan=True).encode()
    except RecursionError:  # the dumpers recurse: deep documents come as plain brackets
        return b"[" * 400 + b"1" + b"]" * 400


def structural(seed: Seed, rng: random.Random) -> tuple[bytes, str]:
    try:
        doc = json.loads(seed.data) if seed.kind == "json" else yaml.safe_load(seed.data)
    except (ValueError, yaml.YAMLError):
        return seed.data, "unchanged"
    paths = _paths(doc)
    n = rng.randint(1, 3)
    hows = []
    for _ in range(n):
        p = rng.choice(paths)
        r = rng.random()
        try:
            if r < 0.6:
                v = copy.deepcopy(rng.choice(HOSTILE))  # never share (or change) the pool
                doc = _set(doc, p, v)
                hows.append(f"set {p[-3:]} = {str(v)[:20]}")
            elif r < 0.75:
                doc = _delete(doc, p)
                hows.append(f"delete {p[-3:]}")
            elif r < 0.85:
                # deep nesting
                deep: Any = 1
                for _ in range(rng.choice([50, 150, 400])):
                    deep = [deep]
                doc = _set(doc, p, deep)
                hows.append(f"deep at {p[-3:]}")
            else:
                # duplicate a list item (duplicate ids); large graphs are special()'s
                parent = p[:-1]
                cur = doc
                for k in parent:
                    cur = cur[k]
                if isinstance(cur, list) and cur and len(cur) < 1000:
                    cur.extend(json.loads(json.dumps(cur[:1])) * rng.randint(1, 3))
                    hows.append(f"duplicate items at {parent[-3:]}")
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        paths = _paths(doc)
        if not paths:
            break
    return _dump(doc, seed.kind, rng), "; ".join(hows) or "none"


def bytewise(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    r = rng.random()
    b = bytearray(data)
    if r < 0.2 or not b:
        cut = rng.randrange(0, len(b) + 1)
        return bytes(b[:cut]), f"truncate at {cut}"
    if r < 0.45:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), "byte flips"
    if r < 0.6:
        i = rng.randrange(len(b))
        j = min(len(b), i + rng.randint(1, 200))
        return bytes(b[:i] + b[j:]), f"delete {i}:{j}"
    if r < 0.75:
        i = rng.randrange(len(b))
        j = min(len(b), i + rng.randint(1, 200))
        return bytes(b[:j] + b[i:j] * rng.randint(2, 50) + b[j:]), f"repeat {i}:{j}"
    if r < 0.85:
        i = rng.randrange(len(b) + 1)
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        return bytes(b[:i] + junk + b[i:]), "insert binary"
    if r < 0.9:
        return b"", "empty"
    if r < 0.95:
        return "ünïcødé\u0000\ufeff✓".encode() * rng.randint(1, 100), "unicode junk"
    return bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096))), "random binary"


ALIAS_BOMB = (
    b"a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    b"c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    b"e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    b"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nservices: *g\ninvocations: *g\n"
)


def special(seed: Seed, rng: random.Random) -> tuple[bytes, str]:
    r = rng.random()
    if seed.kind in ("csv", "gz"):
        raw = gzip.decompress(seed.data) if seed.kind == "gz" else seed.data
        lines = raw.split(b"\n")
        if r < 0.25:
            return gzip.compress(lines[0] + b"\n" + b"0" * (1 << 26), 9), "gzip bomb (one line)"
        if r < 0.4:
            row = lines[1] + b"\n"
            return gzip.compress(lines[0] + b"\n" + row * 400_000, 9), "gzip bomb (rows)"
        if r < 0.6:
            g = gzip.compress(raw)
            return g[: rng.randrange(10, len(g))], "truncated gzip"
        if r < 0.8:
            bad = bytearray(gzip.compress(raw))
            for _ in range(5):
                bad[rng.randrange(10, len(bad))] ^= 0xFF
            return bytes(bad), "corrupt gzip"
        # numbers out of range in a column
        header = lines[0].split(b",")
        col = rng.randrange(len(header))
        value = rng.choice([b"1e308", b"-1e308", b"nan", b"inf", b"-5", b"1" * 400, b"\xff"])
        out = [lines[0]]
        for ln in lines[1:]:
            f = ln.split(b",")
            if len(f) == len(header) and rng.random() < 0.3:
                f[col] = value
            out.append(b",".join(f))
        data = b"\n".join(out)
        return (gzip.compress(data) if seed.kind == "gz" else data), f"column {col} = {value!r}"
    if r < 0.1 and seed.target in ("ecg", "ecg_refs"):
        # 3·10^4 at most: a case is bounded by 20 s on a loaded 2-core machine, and the JSON
        # result of 10^5 calls takes ~10 s to write; 10^5-10^6 are benchmarks/bench_hostile.py's
        k = rng.choice([10_000, 30_000])
        text = ["services: {a: {}, b: {}}", "invocations:"]
        text.append(f"  - {{id: r, callee: a, duration_us: {10 * k + 100}}}")
        parent = "r" if rng.random() < 0.5 else None  # siblings, or a chain k deep
        for i in range(k):
            p = parent or ("r" if i == 0 else f"c{i - 1}")
            text.append(
                f"  - {{id: c{i}, parent: {p}, callee: b, start_us: {10 * i if parent else i}, "
                f"duration_us: {5 if parent else 10 * (k - i)}}}"
            )
        return (
            "\n".join(text) + "\n"
        ).encode(), f"{k} invocations ({'siblings' if parent else 'chain'})"
    if r < 0.3:
        return ALIAS_BOMB, "YAML alias bomb"
    if r < 0.45:
        return b"a: &a [1, *a]\n", "recursive alias"
    if r < 0.6:
        return b"[" * 100_000 + b"]" * 100_000, "deep brackets"
    if r < 0.75:
        return b"a: !!python/object/apply:os.system [echo]\n", "python tag"
    return seed.data + b"\n---\n" + seed.data, "two documents"


def mutate(seed: Seed, rng: random.Random) -> Case:
    r = rng.random()
    mut: Callable[[], tuple[bytes, str]]
    if seed.kind == "cli":
        return Case(seed.target, seed.name, json.dumps(cli_args(rng)).encode(), "cli args")
    if seed.kind in ("json", "yaml") and r < 0.5:
        mut = lambda: structural(seed, rng)  # noqa: E731
    elif r < 0.85:
        mut = lambda: bytewise(seed.data, rng)  # noqa: E731
    else:
        mut = lambda: special(seed, rng)  # noqa: E731
    data, how = mut()
    return Case(seed.target, seed.name, data, how)


_BAD_NUMBERS = ["nan", "inf", "-inf", "-100", "0", "1e308", "-0", "abc", "", "1e-320"]


def cli_args(rng: random.Random) -> list[str]:
    """Options of the commands that need no root, with hostile values (files: the bundled
    examples, written by the worker to EX/)."""
    n = rng.choice(_BAD_NUMBERS + ["100", "3.5"])
    return rng.choice(
        [
            ["predict", "EX/bookinfo.yaml", "--profile", "reference", "--rate", n],
            ["predict", "EX/bookinfo.yaml", "--profile", "reference", "--pod-cpus", n],
            ["profiles", "show", "reference", "--size", n],
            ["profiles", "show", "reference", "--rate", n],
            ["traces", "generate", "--graphs", n, "--out", "OUT/g.csv"],
            ["traces", "generate", "--graphs", "3", "--broken-fraction", n, "--out", "OUT/g.csv"],
            ["--max-input-mb", n, "predict", "EX/bookinfo.yaml", "--profile", "reference"],
            ["predict", "EX", "--profile", "reference"],
            ["predict", "/dev/zero", "--profile", "reference"],
            ["predict", "EX/bookinfo.yaml", "--profile", rng.choice(["", "nope", "../x"])],
            ["profiles", "import", "EX"],
            ["predict", "--traces", "EX/bookinfo.yaml", "--profile", "reference"],
            ["config", "from-envoy", "EX/bookinfo.yaml"],
            ["config", "from-k8s", "EX"],
            ["study", "EX", "--out", "OUT/s", "--profile", "reference"],
        ]
    )


#: a mutated file larger than this is not a useful case (and would only fill memory)
MAX_CASE_BYTES = 16 << 20


def cases(tmp: Path, n: int, seed: int = 15) -> Iterator[Case]:
    """``n`` mutated cases, made one at a time, round-robin over the input paths, then over
    each path's seeds (every path gets its share however many seeds it has)."""
    by_target: dict[str, list[Seed]] = {}
    for s in seeds(tmp):
        by_target.setdefault(s.target, []).append(s)
    targets = sorted(by_target)
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        group = by_target[targets[i % len(targets)]]
        s = group[(i // len(targets)) % len(group)]
        c = mutate(s, rng)
        yield c if len(c.data) <= MAX_CASE_BYTES else Case(c.target, c.name, s.data, "unchanged")
