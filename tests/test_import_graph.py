"""The import graph of the three packages, read from the source (``ast``; imports inside
functions count, those under ``if TYPE_CHECKING:`` do not, as they never run): no import
circles, and dependencies point one way: topologies <- cost_models <- ntp_planner, and the
failure models never import the views that draw them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "cost_models", "ntp_planner")
# circles other changes are removing (the executor's model and its experts); none may be added
KNOWN = {frozenset({"ntp_planner.executor.model.moe", "ntp_planner.executor.model.reference"})}


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports: ``from a.b import c`` is a.b.c when that is a module,
    else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in known)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in child.names:
                    target = f"{base}.{a.name}"
                    found.update([target] if target in known else [base] if base in known else [])
            visit(child)

    visit(ast.parse(path.read_text()))
    return found - {name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_the_circle_finder_finds_a_planted_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == [frozenset({"a", "b", "c"})]


def test_no_import_circles_but_the_known_ones():
    assert set(circles(graph())) <= KNOWN


def test_dependencies_point_one_way():
    edges = graph()
    wrong = sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        for b in targets
        if (a.startswith("topologies") and not b.startswith("topologies"))
        or (a.startswith("cost_models") and b.startswith("ntp_planner"))
        or (a.startswith("ntp_planner.failures") and b.startswith("ntp_planner.views"))
    )
    assert wrong == []
