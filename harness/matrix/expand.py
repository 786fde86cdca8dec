"""Expansion: a matrix → its cells, deterministically, each with a stable key and its full run settings."""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
from dataclasses import dataclass

from harness.cell.spec import CellSpec
from harness.matrix.schema import Matrix, Override
from harness.outcome import AXES, ModelRef, cell_key


@dataclass
class Cell:
    key: str
    axes: dict[str, str]
    spec: CellSpec
    timeout_s: int
    unsupported: str | None = None  # the pre-check: None (launch it) or why the runtime cannot run it


def matches(rule: dict[str, str], axes: dict[str, str]) -> bool:
    return all(fnmatch.fnmatchcase(axes[a], pattern) for a, pattern in rule.items())


def _override_for(matrix: Matrix, model: str) -> list[Override]:
    return [o for pattern, o in matrix.overrides.items() if fnmatch.fnmatchcase(model, pattern)]


def spec_for(matrix: Matrix, axes: dict[str, str]) -> tuple[CellSpec, int]:
    d = matrix.defaults
    tol, max_tokens, max_new, timeout, dtype = d.tolerances.logprob, d.max_tokens, d.max_new_tokens, d.timeout_s, d.dtype
    for o in _override_for(matrix, axes["model"]):
        tol = o.tolerances.logprob if o.tolerances and o.tolerances.logprob is not None else tol
        max_tokens, max_new = o.max_tokens or max_tokens, o.max_new_tokens or max_new
        timeout, dtype = o.timeout_s or timeout, o.dtype or dtype
    model = ModelRef.parse(axes["model"])
    spec = CellSpec(
        model=model.card,
        graph=axes["graph"],
        attention=axes["attention"],
        device=d.device,
        dtype=None if dtype == "auto" else dtype,
        layers=model.layers,
        tiny=model.tiny,
        weights=model.weights,
        max_tokens=max_tokens,
        compiler=axes["compiler"],
        quant=axes["quant"],
        parallel=axes["parallel"],
        seed=d.seed,
        max_new_tokens=max_new,
        top_k=d.top_k,
        logprob_tol=tol,
    )
    return spec, timeout


def expand(matrix: Matrix, filters: list[dict[str, str]] | None = None, tier: str | None = None) -> list[Cell]:
    """Cross product in axis order, then include/exclude, per-model axis limits, tier and CLI filters."""
    if tier is not None and tier not in matrix.tiers:
        from pcg_core.errors import ConfigError

        raise ConfigError(f"tier {tier!r} is not in matrix {matrix.name!r}; tiers: {', '.join(matrix.tiers) or 'none'}")
    rules = [matrix.tiers[tier]] if tier else []
    rules += filters or []
    cells, seen = [], set()
    values = [getattr(matrix.axes, a) for a in AXES]
    for combo in itertools.product(*values):
        axes = dict(zip(AXES, combo))
        key = cell_key(axes)
        if key in seen:
            continue
        seen.add(key)
        if matrix.include and not any(matches(r, axes) for r in matrix.include):
            continue
        if any(matches(r, axes) for r in matrix.exclude):
            continue
        limits = [o.axes for o in _override_for(matrix, axes["model"])]
        if any(axes[a] not in allowed for lim in limits for a, allowed in lim.items()):
            continue
        if not all(matches(r, axes) for r in rules):
            continue
        spec, timeout = spec_for(matrix, axes)
        cells.append(Cell(key, axes, spec, timeout))
    return cells


def shard(cells: list[Cell], index: int, count: int) -> list[Cell]:
    """Cells of shard `index` of `count`: by a hash of the key, so shards stay stable as the matrix grows."""
    return [c for c in cells if int(hashlib.sha1(c.key.encode()).hexdigest(), 16) % count == index]
