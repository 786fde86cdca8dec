"""Expansion: a matrix → its cells, deterministically, each with a stable key and its full run settings."""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
from dataclasses import dataclass

from harness.cell.spec import CellSpec
from harness.matrix.names import did_you_mean, matches_none, value_matches
from harness.matrix.schema import Matrix, Override
from harness.outcome import AXES, ModelRef, cell_key
from pcg_core.errors import ConfigError
from pcg_core.known import world_size


@dataclass
class Cell:
    key: str
    axes: dict[str, str]
    spec: CellSpec
    timeout_s: int
    unsupported: str | None = None  # the pre-check: None (launch it) or why the runtime cannot run it

    @property
    def ranks(self) -> int:
        """Processes the cell runs as (its parallel mode's world size); 1 for a mode whose degrees do not nest
        (the pre-check refuses it, saying why)."""
        try:
            return world_size(self.spec.parallel)
        except ValueError:
            return 1

    @property
    def processes(self) -> int:
        """Workers the launcher starts: one per rank for pcg's engine; one for an SGLang cell, whose server starts
        its own rank processes on the GPUs the worker holds."""
        return 1 if self.spec.engine == "sglang" else self.ranks

    @property
    def gpus(self) -> int | None:
        """GPUs of one host the cell holds: one per rank on CUDA; None on a CPU."""
        return self.ranks if self.spec.device.startswith("cuda") else None


def _override_for(matrix: Matrix, model: str) -> list[Override]:
    return [o for pattern, o in matrix.overrides.items() if fnmatch.fnmatchcase(model, pattern)]


class _RuleSet:
    """Rules matched per axis value once, so a cell is checked against all of them in a few integer ANDs.

    A matrix may have 100,000 cells and 200 rules per list; matching every cell against every rule with fnmatch
    took ~50 s of a dry run. Bit i of masks[axis][value] is set when rule i accepts `value` on that axis (a rule
    silent on the axis accepts every value); a cell satisfies rule i when bit i survives the AND over its axes.
    """

    def __init__(self, rules: list[dict[str, str]], values: dict[str, list[str]]):
        self.all = (1 << len(rules)) - 1
        self.masks = {a: {v: sum(1 << i for i, r in enumerate(rules) if a not in r or value_matches(a, r[a], v))
                          for v in vs} for a, vs in values.items()}

    def satisfied(self, axes: dict[str, str]) -> int:
        bits = self.all
        for a, v in axes.items():
            bits &= self.masks[a][v]
        return bits


def spec_for(matrix: Matrix, axes: dict[str, str], overrides: list[Override] | None = None) -> tuple[CellSpec, int]:
    """The cell's settings: the defaults, then each override whose pattern matches its model (`overrides`: those,
    when the caller has matched them already)."""
    d = matrix.defaults
    tol, max_tokens, max_new, timeout, dtype = d.tolerances.logprob, d.max_tokens, d.max_new_tokens, d.timeout_s, d.dtype
    for o in _override_for(matrix, axes["model"]) if overrides is None else overrides:
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
        kv_cache=axes["kv_cache"],
        engine=axes["engine"],
        seed=d.seed,
        max_new_tokens=max_new,
        top_k=d.top_k,
        logprob_tol=tol,
        peaked=not d.flat_weights,
        memory_share=d.memory_share,
    )
    return spec, timeout


def expand(matrix: Matrix, filters: list[dict[str, str]] | None = None, tier: str | None = None) -> list[Cell]:
    """Cross product in axis order, then include/exclude, per-model axis limits, tier and CLI filters."""
    if tier is not None and tier not in matrix.tiers:
        raise ConfigError(f"tier {tier!r} is not in matrix {matrix.name!r}{did_you_mean(tier, list(matrix.tiers))} "
                          f"(tiers: {', '.join(matrix.tiers) or 'none'})")
    rules = [matrix.tiers[tier]] if tier else []
    rules += filters or []
    cells = []
    values = {a: list(dict.fromkeys(getattr(matrix.axes, a))) for a in AXES}  # a repeated value is one cell
    include, exclude, required = (_RuleSet(r, values) for r in (matrix.include, matrix.exclude, rules))
    overrides = {m: _override_for(matrix, m) for m in values["model"]}
    for combo in itertools.product(*values.values()):
        axes = dict(zip(AXES, combo))
        if matrix.include and not include.satisfied(axes):
            continue
        if exclude.satisfied(axes):
            continue
        if any(axes[a] not in o.axes[a] for o in overrides[axes["model"]] for a in o.axes):
            continue
        if required.satisfied(axes) != required.all:
            continue
        spec, timeout = spec_for(matrix, axes, overrides[axes["model"]])
        cells.append(Cell(cell_key(axes), axes, spec, timeout))
    return cells


def check_selection(matrix: Matrix, filters: list[dict[str, str]], tier: str | None, source: str,
                    skip: tuple[str, ...] = ()) -> None:
    """The tier is one of the matrix's and each filter names a value of its axis (axes in `skip` aside: values
    may still join them, as requested models join the nightly's model axis); else a ConfigError saying so."""
    if tier is not None and tier not in matrix.tiers:
        expand(matrix, tier=tier)  # its error, with the nearest tier
    for f in filters:
        for axis, pattern in f.items():
            values = list(dict.fromkeys(getattr(matrix.axes, axis)))
            if axis not in skip and (why := matches_none(pattern, axis, values, most=20, whose=f"{source}'s")):
                raise ConfigError(f"--filter {axis}={pattern}: {why}")


def select(matrix: Matrix, filters: list[dict[str, str]], tier: str | None, source: str) -> list[Cell]:
    """The cells a run of `source` (the matrix file) takes: expand's, where a filter value that names nothing on
    its axis (a typo) and a tier or filters that leave no cell are bad input, so that a CI job gating on a
    filtered run cannot pass green on an empty one."""
    check_selection(matrix, filters, tier, source)
    cells = expand(matrix, filters=filters, tier=tier)
    if not cells:
        asked = " ".join([*([f"--tier {tier}"] if tier else []),
                          *(f"--filter {a}={p}" for f in filters for a, p in f.items())])
        if asked:
            raise ConfigError(f"{asked} selects no cells of {source}: each value is on its axis, but no cell has "
                              "them all (the matrix's include/exclude rules, overrides and tiers leave none); "
                              f"`pcgh run {source} --dry-run` lists its cells")
        raise ConfigError(f"{source} has no cells: its include/exclude rules and overrides' axis limits leave none")
    return cells


def shard(cells: list[Cell], index: int, count: int) -> list[Cell]:
    """Cells of shard `index` of `count`: by a hash of the key, so shards stay stable as the matrix grows."""
    return [c for c in cells if int(hashlib.sha1(c.key.encode()).hexdigest(), 16) % count == index]
