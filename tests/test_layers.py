"""The layout holds: each package imports only the layers below it, no module import cycle,
no folder over a quarter of the code, no file over 600 lines (docs/architecture.md)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "meshtax"

#: modules every layer may use (no meshtax imports of their own beyond these)
BOTTOM = {"_version", "errors", "safeio"}
#: what each layer may import besides itself and BOTTOM; arrows point down only
ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "predict": {"model"},
    "traces": {"model"},
    "store": {"model"},
    "testbed": {"model"},
    "profile": {"testbed", "model"},
    "validate": {"testbed", "predict", "traces", "model"},
    "study": {"predict", "traces", "model"},
    "report": {"predict", "model"},
    "app": {
        "profile",
        "validate",
        "study",
        "report",
        "testbed",
        "predict",
        "traces",
        "store",
        "model",
    },  # fmt: skip
    "cli": {"app", "report", "predict", "traces", "store", "model"},
    "__init__": set(),
}


def _layer(module: str) -> str:
    """``meshtax.profile.run`` → ``profile``; ``meshtax.cli`` → ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(path: Path, module: str) -> set[str]:
    """Every meshtax module ``path`` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text(), str(path))
    got: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    typing_only = {
        id(n)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.If)
        and ast.unparse(stmt.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for body in stmt.body
        for n in ast.walk(body)
    }  # imports for annotations only: no runtime edge
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            got.update(a.name for a in node.names if a.name.startswith("meshtax"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            if base.startswith("meshtax"):
                subs = {f"{base}.{a.name}" for a in node.names}
                # `from meshtax import safeio` imports the module, not the package's __init__
                got.update(subs if subs <= set(MODULES) else {base, *subs})
    return got


MODULES = _modules()
GRAPH = {m: {i for i in _imports(p, m) if i in MODULES and i != m} for m, p in MODULES.items()}


def test_no_upward_or_sideways_import() -> None:
    bad = []
    for m, deps in GRAPH.items():
        src = _layer(m)
        for d in deps:
            dst = _layer(d)
            if dst in (src, *BOTTOM) or dst in ALLOWED[src]:
                continue
            bad.append(f"{m} imports {d} ({src} → {dst})")
    assert not bad, "\n".join(sorted(bad))


def test_every_layer_is_known() -> None:
    layers = {_layer(m) for m in MODULES}
    assert layers <= set(ALLOWED) | BOTTOM, layers - set(ALLOWED) - BOTTOM


def test_no_import_cycle() -> None:
    # a package imports its own __init__ implicitly: only explicit edges count
    color: dict[str, int] = defaultdict(int)
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        color[m] = 1
        stack.append(m)
        for d in sorted(GRAPH[m]):
            if color[d] == 1:
                cycles.append([*stack[stack.index(d) :], d])
            elif color[d] == 0:
                visit(d)
        stack.pop()
        color[m] = 2

    for m in sorted(GRAPH):
        if color[m] == 0:
            visit(m)
    assert not cycles, "\n".join(" → ".join(c) for c in cycles)


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines())


def test_no_file_over_600_lines() -> None:
    long = {str(p.relative_to(SRC)): _lines(p) for p in SRC.rglob("*.py") if _lines(p) > 600}
    assert not long, long


def test_no_folder_over_a_quarter_of_the_code() -> None:
    by_folder: dict[str, int] = defaultdict(int)
    total = 0
    for p in SRC.rglob("*.py"):
        n = _lines(p)
        total += n
        rel = p.relative_to(SRC)
        if len(rel.parts) > 1:
            by_folder[rel.parts[0]] += n
    shares = {k: v / total for k, v in by_folder.items()}
    assert max(shares.values()) < 0.25, {k: f"{v:.0%}" for k, v in shares.items()}


@pytest.mark.parametrize("rule", sorted(ALLOWED))
def test_layer_rules_point_down(rule: str) -> None:
    """The table above is acyclic: no layer may reach back up to one that depends on it."""
    seen: set[str] = set()
    todo = list(ALLOWED[rule])
    while todo:
        x = todo.pop()
        assert x != rule, f"{rule} can reach itself"
        if x not in seen:
            seen.add(x)
            todo.extend(ALLOWED.get(x, set()))
