"""The house's import graph, read from the source: every Import/ImportFrom node, including those inside functions
and under TYPE_CHECKING, so a cycle dodged with a function-local import, or hidden from the runtime by
TYPE_CHECKING, still counts. An import that runs also runs the packages above its target (`a.b` for `a.b.c`),
unless the importer lives inside them; a TYPE_CHECKING import runs nothing, so it adds only the edge to its
target. Shared by tests/test_layers.py (the whole house) and tests/pcg_core/test_imports.py (the runtime).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pcg_core", "harness", "web", "benchmarks")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _import_nodes(node: ast.AST, typing_only: bool = False, deferred: bool = False):
    """(Import/ImportFrom node, whether it only runs under a type checker, whether it waits for a call), anywhere
    below `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, typing_only, deferred
        elif _is_type_checking(child):
            for part in child.body:
                yield from _import_nodes(ast.Module(body=[part], type_ignores=[]), True, deferred)
            for part in child.orelse:
                yield from _import_nodes(ast.Module(body=[part], type_ignores=[]), typing_only, deferred)
        else:
            yield from _import_nodes(child, typing_only, deferred or isinstance(child, _FUNCTIONS))


def imports(name: str, at_import: bool = False) -> dict[str, bool]:
    """Absolute name → whether the import runs (False: TYPE_CHECKING only). Modules where they are modules,
    else the module the names come from. With `at_import`, only the imports that run when `name` is imported
    (not those inside functions)."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: dict[str, bool] = {}

    def add(target: str, runs: bool) -> None:
        found[target] = found.get(target, False) or runs

    for node, typing_only, deferred in _import_nodes(tree):
        if at_import and (deferred or typing_only):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, not typing_only)
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            add(base, not typing_only)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    add(f"{base}.{alias.name}", not typing_only)
    return found


def raw_imports(name: str) -> set[str]:
    """Every name `name` imports, TYPE_CHECKING and function-local imports included."""
    return set(imports(name))


def edges(name: str, at_import: bool = False) -> set[str]:
    """The house's modules `name` depends on: each module it imports (TYPE_CHECKING included) and, for imports
    that run, the packages above it whose __init__ runs first (unless `name` is inside them). With `at_import`,
    only what importing `name` runs."""
    out = set()
    for target, runs in imports(name, at_import).items():
        if target not in MODULES:
            continue
        out.add(target)
        parts = target.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if runs and not (name == parent or name.startswith(parent + ".")):
                out.add(parent)
    out.discard(name)
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


GRAPH = {name: edges(name) for name in MODULES}
# What importing each module runs: the graph a lean deployment's imports follow.
IMPORT_TIME_GRAPH = {name: edges(name, at_import=True) for name in MODULES}
