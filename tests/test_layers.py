"""The house's import graph (tests/import_graph.py reads it from the source): no cycle anywhere, no arrow running
up the data path runtime (pcg_core) → cell/judge → store → reports → web, and the store, the reports and the
dashboard never reach a module that imports the runtime's heavy libraries. Inside the cell, the judge keeps to its
room (harness/cell/judge/): it reads the cell's spec, prompts, coverage and crash, never the cell runner. The floors
inside pcg_core are tests/pcg_core/test_imports.py's. And the sizes a reader can hold (issue 43): in the runtime and
the harness no function over 60 lines, no module over 500."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from import_graph import GRAPH, IMPORT_TIME_GRAPH, ROOT, find_cycles, imports

# Floors, lowest first; a module may import its own floor or lower ones. The longest matching prefix decides.
FLOORS: dict[str, int] = {
    "pcg_core": 0,
    "harness.outcome": 1, "harness.metrics": 1, "harness.repro": 1,  # the vocabulary every later stage reads
    "harness.safe_yaml": 1,  # the bounded YAML reader of matrices and model cards
    "harness.cards": 2, "harness.shape": 2,  # model cards; a model's shape from its config (widths, parameters)
    "harness.cell": 3,
    "harness.sglang": 3,  # another engine's cell: SGLang's servers, beside pcg's cell runner
    "harness.matrix": 4,
    "harness.store": 5,
    "harness.reports": 6,
    "harness.launcher": 7, "harness.request": 7,
    "harness": 8,  # the package root and the command line (harness/cli/): the top of the harness
    "web": 9,
    "benchmarks": 10,
}
HEAVY = ("torch", "transformers", "huggingface_hub", "safetensors")
LEAN = ("harness.outcome", "harness.metrics", "harness.repro", "harness.store", "harness.reports", "web")
# The judge's room, and what of the rest of the cell it may read: the cell runner (run.py) calls the judge's policy,
# never the other way round (the policy reads the cell through a Protocol).
JUDGE = "harness.cell.judge"
JUDGE_READS = ("harness.cell.spec", "harness.cell.prompts", "harness.cell.coverage", "harness.cell.crash")


def floor(name: str) -> int:
    key = max((k for k in FLOORS if name == k or name.startswith(k + ".")), key=len, default=None)
    if key is None:
        raise AssertionError(f"{name} is on no floor: add its package to FLOORS")
    return FLOORS[key]


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} → {b}" for a, targets in graph.items() for b in targets if floor(b) > floor(a))


def judge_leaves_its_room(graph: dict[str, set[str]]) -> list[str]:
    """Arrows from the judge's modules to the cell's outside what it may read (the package root included: its lazy
    exports reach the runner)."""
    def inside(name: str) -> bool:
        return name == JUDGE or name.startswith(JUDGE + ".")

    return sorted(f"{a} → {b}" for a, targets in graph.items() if inside(a) for b in targets
                  if (b == "harness.cell" or b.startswith("harness.cell.")) and not inside(b) and b not in JUDGE_READS)


def heavy_reached(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """For each lean module, the house's modules its import runs (transitively) that import a heavy library when
    they are imported (a deferred import inside a function is the way to keep one out)."""
    heavy = {m for m in graph if any(t.split(".")[0] in HEAVY for t in imports(m, at_import=True))}
    out = {}
    for root in (m for m in graph if m.startswith(LEAN)):
        seen, todo = set(), [root]
        while todo:
            for t in graph.get(todo.pop(), ()):
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        if seen & heavy:
            out[root] = sorted(seen & heavy)
    return out


def test_no_import_cycles():
    assert find_cycles(GRAPH) == []


def test_no_upward_imports():
    assert upward(GRAPH) == []


def test_the_judge_keeps_to_its_room():
    assert {"harness.cell.judge.policy", "harness.cell.judge.tokens"} <= set(GRAPH)
    assert "harness.cell.judge.policy" in GRAPH["harness.cell.run"]  # the runner calls the policy
    assert judge_leaves_its_room(GRAPH) == []


@pytest.mark.parametrize("src,dst", [
    ("harness.cell.judge.policy", "harness.cell.run"),  # the policy reaching back into the runner
    ("harness.cell.judge.lockstep", "harness.cell.memory"),
    ("harness.cell.judge.tokens", "harness.cell"),  # the package root, whose lazy exports are the runner's
])
def test_a_planted_way_out_of_the_judge_is_caught(src, dst):
    planted = {k: set(v) for k, v in GRAPH.items()}
    planted[src].add(dst)
    assert judge_leaves_its_room(planted) == [f"{src} → {dst}"]


def test_every_package_is_read():
    assert {"pcg_core.errors", "harness.outcome", "harness.store.repository", "harness.reports.frame", "web.app",
            "benchmarks.prefill"} <= set(GRAPH)
    assert "harness.outcome" in GRAPH["harness.store.repository"]


def test_store_reports_and_dashboard_stay_lean():
    assert heavy_reached(IMPORT_TIME_GRAPH) == {}


def test_a_planted_heavy_reach_is_caught():
    planted = {k: set(v) for k, v in IMPORT_TIME_GRAPH.items()}
    planted["harness.reports.frame"].add("harness.cell.judge.tokens")  # the judge imports the engine's types
    assert "harness.reports.frame" in heavy_reached(planted) and "web.app" in heavy_reached(planted)


@pytest.mark.parametrize("src,dst", [
    ("harness.store.repository", "web.app"),  # the store reaching the dashboard
    ("harness.store.repository", "harness.reports.frame"),  # the store reaching its readers
    ("pcg_core.config", "harness.outcome"),  # the runtime reaching the harness
])
def test_a_planted_upward_arrow_is_caught(src, dst):
    planted = {k: set(v) for k, v in GRAPH.items()}
    planted[src].add(dst)
    assert f"{src} → {dst}" in upward(planted)


def test_a_planted_cycle_is_caught():
    planted = {k: set(v) for k, v in GRAPH.items()}
    planted["harness.outcome"].add("harness.store.repository")  # the store imports the outcome
    assert any({"harness.outcome", "harness.store.repository"} <= set(c) for c in find_cycles(planted))


# Sizes ------------------------------------------------------------------------------------------------------------
SIZED = ("harness", "pcg_core")
MAX_FUNCTION_LINES = 60  # the def line to the body's last, decorators not counted
MAX_MODULE_LINES = 500
NO_FUNCTION_LIMIT = ("pcg_core/quant/kernels/",)  # the kernels: a Triton @triton.jit body is one function
# Functions allowed past the limit while they are split ("path::name"); none now.
LONG_FUNCTIONS_ALLOWED: set[str] = set()


def sized_files() -> dict[str, Path]:
    """Each module of the runtime and the harness by its path from the repository root."""
    return {p.relative_to(ROOT).as_posix(): p for pkg in SIZED for p in sorted((ROOT / pkg).rglob("*.py"))}


def long_functions(source: str, path: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(`path::name`, lines) of each function in `source` (methods and nested ones too) longer than `limit`."""
    return [(f"{path}::{f.name}", f.end_lineno - f.lineno + 1) for f in ast.walk(ast.parse(source, filename=path))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > limit]


def long_module(source: str, limit: int = MAX_MODULE_LINES) -> int | None:
    """The module's line count when it is over `limit` (as `wc -l` counts a file that ends in a newline)."""
    n = len(source.splitlines())
    return n if n > limit else None


def test_no_function_is_over_60_lines():
    found = [long for path, file in sized_files().items() if not path.startswith(NO_FUNCTION_LIMIT)
             for long in long_functions(file.read_text(encoding="utf-8"), path)]
    over = [f"{name} ({n} lines)" for name, n in found if name not in LONG_FUNCTIONS_ALLOWED]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(over)}"


def test_no_module_is_over_500_lines():
    found = {path: long_module(file.read_text(encoding="utf-8")) for path, file in sized_files().items()}
    over = [f"{path} ({n} lines)" for path, n in found.items() if n is not None]
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {', '.join(over)}"


def _function(name: str, lines: int, indent: str = "") -> str:
    """Source of a function `lines` long, its def line and return included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return 0\n"


def test_a_planted_61_line_function_is_caught():
    source = (_function("fits", 60) + "\n\n@decorated\n" + _function("fits_decorated", 60)
              + "\n\nclass Holder:\n" + _function("too_long", 61, indent="    "))
    assert long_functions(source, "harness/planted.py") == [("harness/planted.py::too_long", 61)]


def test_a_planted_501_line_module_is_caught():
    assert long_module("x = 0\n" * 501) == 501 and long_module("x = 0\n" * 500) is None


def rooms_without_source(tests: Path, root: Path) -> list[str]:
    """Test folders with no source folder of the same path: the tests mirror the source tree room by room
    (docs/testing.md), so a reader finds a module's tests by its path."""
    return sorted(str(d.relative_to(tests)) for d in tests.rglob("*")
                  if d.is_dir() and d.name != "__pycache__" and not (root / d.relative_to(tests)).is_dir())


def test_the_tests_mirror_the_source_rooms():
    assert rooms_without_source(ROOT / "tests", ROOT) == []


def test_a_planted_room_without_source_is_caught(tmp_path):
    (tmp_path / "src" / "pcg_core" / "attention").mkdir(parents=True)
    (tmp_path / "tests" / "pcg_core" / "attention").mkdir(parents=True)
    (tmp_path / "tests" / "pcg_core" / "kernels").mkdir()  # no pcg_core/kernels
    assert rooms_without_source(tmp_path / "tests", tmp_path / "src") == ["pcg_core/kernels"]
