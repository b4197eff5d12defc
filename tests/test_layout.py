"""The shape of the tree, checked: no import circles among our modules, dependencies pointing one
way (topologies <- cost_models <- ntp_planner), and the executor, views and CLI in small pieces
(modules up to 400 lines, function bodies up to 60). The allowlists name what is over today and why;
they must shrink: an entry that no longer applies fails too, so that it is removed.

Imports are read with ``ast`` (nothing is imported), at module level, inside functions (they
run at call time but tie the modules together just the same) and under ``if TYPE_CHECKING:``
(they never run, but a module that names another's types depends on it: a circle through them
is one a refactor must break all the same).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "cost_models", "ntp_planner")
SMALL = ("ntp_planner/executor", "ntp_planner/views", "ntp_planner/cli")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60

# Strongly connected components of the import graph that exist today, as sets of modules.
KNOWN_CYCLES: dict[frozenset[str], str] = {}

# Modules over MAX_MODULE_LINES and functions over MAX_FUNCTION_LINES ("path::Class.function").
TOO_LONG: dict[str, str] = {}


@cache
def modules() -> dict[str, Path]:
    """Every module of our packages by dotted name (a package by its own name)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(name: str, node: ast.AST) -> list[str]:
    """Our modules that the import ``node`` in module ``name`` loads (``from pkg import sub``
    loads the submodule ``pkg.sub`` when there is one, else ``pkg`` itself)."""
    known = modules()
    if isinstance(node, ast.Import):
        found = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the package the module is in
            here = name.split(".") if modules()[name].name == "__init__.py" else name.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
        found = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for target in found:
        while target and target not in known:  # ``import a.b.c`` of a name inside a module
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(target)
    return out


@cache
def graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports, anywhere in its body."""
    edges = {}
    for name, path in modules().items():
        imports = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import | ast.ImportFrom)]
        edges[name] = {t for n in imports for t in _targets(name, n)}
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's components of more than one module.

    >>> sorted(map(sorted, strongly_connected({"a": {"b"}, "b": {"a", "c"}, "c": set()})))
    [['a', 'b']]
    """
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(frozenset(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def a_cycle(edges: dict[str, set[str]], part: frozenset[str]) -> str:
    """One circle through the component, 'a -> b -> a', shortest from its first module."""
    start = min(part)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(edges[path[-1]] & part):
            if w == start:
                return " -> ".join([*path, start])
            if w not in seen:
                seen.add(w)
                paths.append([*path, w])
    return start


def test_no_import_circles_beyond_the_known_ones():
    edges = graph()
    parts = strongly_connected(edges)
    new = [a_cycle(edges, p) for p in parts if p not in KNOWN_CYCLES]
    gone = [sorted(p) for p in KNOWN_CYCLES if p not in parts]
    assert not new, "import circles:\n  " + "\n  ".join(new)
    assert not gone, f"no longer circles (remove them from KNOWN_CYCLES): {gone}"


def test_dependencies_point_from_ntp_planner_to_cost_models_to_topologies():
    forbidden = {"topologies": ("cost_models", "ntp_planner"), "cost_models": ("ntp_planner",)}
    wrong = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        for target in sorted(targets)
        if target.split(".")[0] in forbidden.get(name.split(".")[0], ())
    ]
    assert not wrong, "\n".join(wrong)


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its signature and docstring left out: a typer command lists
    one option per line of its signature, and a docstring that explains is never too long.

    >>> _body_lines(ast.parse('def f(\\n  a,\\n  b,\\n):\\n    "Doc."\\n    x = a\\n    return x\\n').body[0])
    2
    """
    body = fn.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return fn.end_lineno - body[0].lineno + 1


def _lengths() -> dict[str, int]:
    """Lines of every module under SMALL ('path') and of every function there ('path::qualname')."""
    out = {}
    for top in SMALL:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            out[rel] = len(text.splitlines())

            def walk(node: ast.AST, prefix: str, rel: str = rel) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        qual = f"{prefix}{child.name}"
                        if not isinstance(child, ast.ClassDef):
                            out[f"{rel}::{qual}"] = _body_lines(child)
                        walk(child, f"{qual}.")
                    else:
                        walk(child, prefix)

            walk(ast.parse(text), "")
    return out


def test_the_executor_views_and_cli_are_in_small_pieces():
    lengths = _lengths()
    limit = lambda key: MAX_FUNCTION_LINES if "::" in key else MAX_MODULE_LINES  # noqa: E731
    over = {key: n for key, n in lengths.items() if n > limit(key) and key not in TOO_LONG}
    stale = [key for key in TOO_LONG if lengths.get(key, 0) <= limit(key)]
    assert not over, "over the limit (split them):\n  " + "\n  ".join(f"{k}: {n} lines" for k, n in over.items())
    assert not stale, f"within the limit now or gone (remove them from TOO_LONG): {stale}"


def test_the_import_reader_resolves_what_it_meets():
    # relative, submodule and name imports, each to the module that runs
    edges = graph()
    assert "cost_models.degraded" in edges["ntp_planner.executor.parallel.ownership"]
    assert "ntp_planner.executor.model.moe" in edges["ntp_planner.executor.train.stage"]
    # a function-level import counts: the CLI reaches the executor's launcher only inside commands
    assert "ntp_planner.executor.train.launch" in edges["ntp_planner.cli.validate"]
