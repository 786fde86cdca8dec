"""The house's import graph (tests/import_graph.py reads it from the source): no cycle anywhere, no arrow running
up the data path runtime (pcg_core) → cell/judge → store → reports → web, and the store, the reports and the
dashboard never reach a module that imports the runtime's heavy libraries. Inside the cell, the judge keeps to its
room (harness/cell/judge/): it reads the cell's spec, prompts, coverage and crash, never the cell runner. The floors
inside pcg_core are tests/pcg_core/test_imports.py's."""

from __future__ import annotations

import pytest

from import_graph import GRAPH, IMPORT_TIME_GRAPH, find_cycles, imports

# Floors, lowest first; a module may import its own floor or lower ones. The longest matching prefix decides.
FLOORS: dict[str, int] = {
    "pcg_core": 0,
    "harness.outcome": 1, "harness.repro": 1,  # the vocabulary every later stage reads
    "harness.safe_yaml": 1,  # the bounded YAML reader of matrices and model cards
    "harness.cards": 2, "harness.shape": 2,  # model cards; a model's shape from its config (widths, parameters)
    "harness.cell": 3,
    "harness.matrix": 4,
    "harness.store": 5,
    "harness.reports": 6,
    "harness.launcher": 7, "harness.request": 7,
    "harness": 8,  # the package root and the command line (harness/cli/): the top of the harness
    "web": 9,
    "benchmarks": 10,
}
HEAVY = ("torch", "transformers", "huggingface_hub", "safetensors")
LEAN = ("harness.outcome", "harness.repro", "harness.store", "harness.reports", "web")
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
