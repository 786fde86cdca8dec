"""Names in a matrix, checked when it loads: a typo is an error with a suggestion, not an `unsupported` cell.

Known means: registered with the runtime (capture and attention backends, read from the registries now, after
the PCG_PLUGINS plugins have registered theirs), or named in pcg_core.known (schemes and backends planned but
not implemented yet: those stay cells, unsupported with the pre-check's reason), or a model card in
harness/models/ that offers the variant. Rules and override patterns must match a value of the matrix, else
they are dead (usually a typo) and silently do nothing.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.cards import CARDS_DIR, ModelCard, find_card
from harness.outcome import AXES, ENGINES, ModelRef
from pcg_core.known import COMPILERS, KNOWN_QUANTIZATION, KV_CACHE_DTYPES, PLANNED_ATTENTION, parse_parallel
from pcg_core.quant.schemes import registry as quant_registry

# Every cell is a process (minutes on a GPU): the full matrix is ~3,000 cells. expand() walks the whole cross
# product before any filter, so a product this big is a mistake (or a bomb), not a plan.
MAX_CELLS = 100_000

Problem = tuple[tuple, str]  # (pydantic-style location, message)
Checker = Callable[[str], str | None]  # value → why it is not known, or None


def did_you_mean(value: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _in(kind: str, known: list[str]) -> Checker:
    def check(value: str) -> str | None:
        if value in known:
            return None
        return f"unknown {kind} {value!r}{did_you_mean(value, known)} (known: {', '.join(known)})"

    return check


def _parallel(value: str) -> str | None:
    try:
        parse_parallel(value)
    except ValueError as e:
        fixed = re.sub(r"(?<=[0-9])-?(?=[a-z])", "-", value.lower().replace("_", "-"))  # TP2ep8 → tp2-ep8
        try:
            parse_parallel(fixed)
        except ValueError:
            return str(e)
        return f"{e}; did you mean {fixed!r}?"
    return None


def axis_checkers() -> dict[str, Checker]:
    """One checker per non-model axis, from the registries as they are now (plugins loaded first).

    The registries' own module, not the backends': it declares the built-in names and holds what plugins
    register, and costs no torch, so a typo in a matrix is reported before the runtime is imported (seconds).
    The runtime's schemes are all in KNOWN_QUANTIZATION (tests/harness/matrix/test_names.py holds it to that).
    """
    from pcg_core.plugins import load_plugins
    from pcg_core.registry import ATTENTION_BACKENDS, CAPTURE_BACKENDS

    load_plugins()  # idempotent: the CLI and the worker have loaded them already; a library caller may not have
    graphs = [b for b in CAPTURE_BACKENDS.names() if b != "disabled"]  # disabled is the eager reference itself
    attention = list(dict.fromkeys([*ATTENTION_BACKENDS.names(), *PLANNED_ATTENTION]))
    quant = list(KNOWN_QUANTIZATION)
    return {
        "graph": _in("capture backend", graphs),
        "compiler": _in("compiler", list(COMPILERS)),
        "attention": _in("attention backend", attention),
        "quant": _in("quantization scheme", quant),
        "parallel": _parallel,
        "kv_cache": _in("KV cache dtype", list(KV_CACHE_DTYPES)),
        "engine": _in("engine", list(ENGINES)),
    }


class _Models:
    """Model values → problems, reading each card once."""

    def __init__(self, cards_dir: Path):
        self.cards_dir = cards_dir
        self.ids = sorted(p.stem for p in cards_dir.glob("*.yaml"))
        self.cards: dict[str, ModelCard | None] = {}

    def __call__(self, value: str) -> str | None:
        ref = ModelRef.parse(value)  # the schema has checked the grammar
        if ref.card not in self.ids:
            return (f"no model card {ref.card!r} in {self.cards_dir}{did_you_mean(ref.card, self.ids)} "
                    "(`pcgh models` lists them)")
        if ref.card not in self.cards:
            self.cards[ref.card] = find_card(ref.card, self.cards_dir)
        card = self.cards[ref.card]
        offered = card.variants if card else []
        if not (ref.variant in offered or (ref.layers is not None and "trim" in offered)):
            return f"card {ref.card} offers variants {', '.join(offered)}, not {ref.variant}"
        depth = card.config.get("num_hidden_layers") if card else None
        if ref.layers is not None and isinstance(depth, int) and ref.layers > depth:
            return f"{value}: card {ref.card} has {depth} decoder layers; trim to at most {depth}"
        return None


def value_matches(axis: str, pattern: str, value: str) -> bool:
    """A rule's or filter's pattern against an axis value: a glob, and on the quant axis also `family:GLOB`, the
    schemes of a family (w8a8, w4a8, w4a16, or the weights' type fp8, int8, int4, fp4: quant/schemes/registry.py),
    so a matrix selects schemes by what they are rather than by how their names are spelled."""
    if axis == "quant":
        return quant_registry.quant_matches(pattern, value)
    return fnmatch.fnmatchcase(value, pattern)


def _matches_any(pattern: str, values: list[str], axis: str = "") -> bool:
    if axis == "quant":
        return any(value_matches(axis, pattern, v) for v in values)
    if not any(c in pattern for c in "*?["):
        return pattern in values
    match = re.compile(fnmatch.translate(pattern)).match  # as fnmatchcase does, compiled once for the whole list
    return any(match(v) for v in values)


def matches_none(pattern: str, axis: str, values: list[str], most: int = 8, whose: str = "the matrix's") -> str | None:
    """Why `pattern` (a glob on `axis`) is dead: it matches none of `values`, with the nearest ones; else None."""
    if _matches_any(pattern, values, axis):
        return None
    if axis == "quant" and pattern.startswith(quant_registry.FAMILY_PREFIX):
        fams = ", ".join(quant_registry.FAMILIES)
        return (f"{pattern!r} matches none of {whose} quant values ({', '.join(values)}); families: {fams}"
                f"{did_you_mean(pattern[len(quant_registry.FAMILY_PREFIX):], list(quant_registry.FAMILIES))}")
    have = ", ".join(values) if len(values) <= most else f"{', '.join(values[:most])}, … {len(values)} in all"
    return f"{pattern!r} matches none of {whose} {axis} values ({have}){did_you_mean(pattern, values)}"


def _rule_problems(loc: tuple, rule: dict[str, str], values: dict[str, list[str]], skip: set[str]) -> list[Problem]:
    return [((*loc, axis), why) for axis, pattern in rule.items()
            if axis not in skip and (why := matches_none(pattern, axis, values[axis])) is not None]


def name_problems(matrix: Any, cards_dir: Path = CARDS_DIR) -> list[Problem]:
    """Every unknown axis value, dead rule or pattern and over-large product in `matrix` (a schema.Matrix; not
    imported, even for typing: the schema imports this module), with where it is.

    One problem per typo: rules and patterns on an axis that has an unknown value are not checked against it
    (a tier's `graph: piecewise` is dead only because the axis says `piecewize`); fixing the value shows any left.
    """
    checkers: dict[str, Checker] = {"model": _Models(cards_dir), **axis_checkers()}
    values = {a: getattr(matrix.axes, a) for a in AXES}
    problems: list[Problem] = []
    for axis in AXES:
        for i, value in enumerate(values[axis]):
            if (why := checkers[axis](value)) is not None:
                problems.append((("axes", axis, i), why))
    misspelt = {loc[1] for loc, _ in problems}
    cells = math.prod(len(set(v)) for v in values.values())
    if cells > MAX_CELLS:
        problems.append((("axes",), f"the axes make {cells:,} cells, over the {MAX_CELLS:,} a matrix may have; "
                                    "split the matrix or use fewer values"))
    for i, rule in enumerate(matrix.include):
        problems += _rule_problems(("include", i), rule, values, misspelt)
    for i, rule in enumerate(matrix.exclude):
        problems += _rule_problems(("exclude", i), rule, values, misspelt)
    for name, rule in matrix.tiers.items():
        problems += _rule_problems(("tiers", name), rule, values, misspelt)
    for pattern, override in matrix.overrides.items():
        problems += _rule_problems(("overrides", pattern), {"model": pattern}, values, misspelt)
        for axis, allowed in override.axes.items():
            for i, value in enumerate(allowed):
                if (why := checkers[axis](value)) is not None:
                    problems.append((("overrides", pattern, "axes", axis, i), why))
    return problems
