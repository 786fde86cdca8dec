"""The matrix file schema (harness/configs/*.yaml), validated on load.

A matrix names the axes to sweep, the defaults every cell starts from, include/exclude rules (glob patterns
per axis), per-model overrides (tolerances, limits, which axis values apply) and named tiers (filters).
Loading is bounded (safe_yaml), numbers have ranges (below), names must be known (names.py).
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.cards import CARDS_DIR
from harness.matrix.names import did_you_mean, name_problems
from harness.matrix.yaml_lines import line_of, load_yaml_with_lines
from harness.outcome import AXES, ModelRef
from pcg_core.errors import ConfigError
from pcg_core.known import MAX_TOKENS
from pcg_core.quant.schemes import registry as quant_registry

# Ranges, so a typo fails at load instead of as a 6 GB allocation or a week-long run:
MAX_NEW_TOKENS = 4096  # greedy decode steps per prompt, each judged: the suite needs ≤ 16; 4096 is minutes per cell
MAX_TOP_K = 100  # top-k logprobs kept per position in every result row; the judge reads 5
MAX_TIMEOUT_S = 24 * 3600  # a cell that needs more than a day is hung
MAX_SEED = 2**63 - 1  # torch.manual_seed takes it (seed + 1 too), as `pcgh cell --seed` does
MAX_LOGPROB_TOL = 10.0  # 10 nats of |Δlogprob| is a factor e^10 ≈ 22,000: past it the judge judges nothing
MAX_RULES = 200  # per list (include, exclude, overrides, tiers): expand() matches every cell against every rule

MaxTokens = Annotated[int, Field(gt=0, le=MAX_TOKENS, description="largest token bucket (allocated up front)")]
MaxNewTokens = Annotated[int, Field(gt=0, le=MAX_NEW_TOKENS)]
TimeoutS = Annotated[int, Field(gt=0, le=MAX_TIMEOUT_S)]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Tolerances(_Strict):
    logprob: float | None = Field(default=None, gt=0, le=MAX_LOGPROB_TOL, allow_inf_nan=False,
                                  description="max |Δlogprob| on agreeing positions")


class Defaults(_Strict):
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Dtype = "auto"
    prompt_suite: Literal["edges"] = "edges"
    max_new_tokens: MaxNewTokens = 8
    top_k: int = Field(default=5, gt=0, le=MAX_TOP_K)
    max_tokens: MaxTokens = 4096
    timeout_s: TimeoutS = 900
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    tolerances: Tolerances = Tolerances()
    memory_share: float = Field(default=0.10, gt=0, le=1, allow_inf_nan=False,
                                description="the graph pool's share of what the KV cache could have had (beside the "
                                            "weights) past which a cell's verdict carries a memory line")
    flat_weights: bool = Field(default=False, description="synthetic weights as initialized, without the peaked "
                                                             "output head (the judge then sees flat distributions)")


class Axes(_Strict):
    model: list[str] = Field(min_length=1)
    quant: list[str] = Field(default_factory=lambda: ["none"], min_length=1)
    attention: list[str] = Field(default_factory=lambda: ["sdpa"], min_length=1)
    parallel: list[str] = Field(default_factory=lambda: ["tp1"], min_length=1)
    graph: list[str] = Field(default_factory=lambda: ["piecewise"], min_length=1)
    compiler: list[str] = Field(default_factory=lambda: ["eager"], min_length=1)
    kv_cache: list[str] = Field(default_factory=lambda: ["auto"], min_length=1)
    engine: list[str] = Field(default_factory=lambda: ["pcg"], min_length=1)

    @field_validator("quant")
    @classmethod
    def _quant_names(cls, values: list[str]) -> list[str]:
        """A scheme's alias (fp4, as stored runs and older matrices spell NVFP4) is the scheme: one cell, one key."""
        return list(dict.fromkeys(quant_registry.canonical(v) for v in values))

    @field_validator("model")
    @classmethod
    def _model_variant(cls, values: list[str]) -> list[str]:
        for v in values:
            ModelRef.parse(v)  # ValueError naming the grammar
        return values


class Override(_Strict):
    tolerances: Tolerances | None = None
    max_tokens: MaxTokens | None = None
    max_new_tokens: MaxNewTokens | None = None
    timeout_s: TimeoutS | None = None
    dtype: Dtype | None = None
    axes: dict[str, list[str]] = Field(default_factory=dict, description="axis values this model is limited to")

    @field_validator("axes")
    @classmethod
    def _axes_known(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        bad = [a for a in value if a not in AXES or a == "model"]
        if bad:
            limits = [a for a in AXES if a != "model"]
            raise ValueError(f"unknown axis {bad}{did_you_mean(bad[0], limits)} (limits may name {', '.join(limits)})")
        if "quant" in value:  # as the axis reads them: an alias is its scheme
            value = {**value, "quant": [quant_registry.canonical(v) for v in value["quant"]]}
        return value


def _check_rule(rule: dict[str, str]) -> dict[str, str]:
    bad = [a for a in rule if a not in AXES]
    if bad:
        raise ValueError(f"rule {rule} names unknown axis {bad}{did_you_mean(bad[0], AXES)} (axes: {', '.join(AXES)})")
    return rule


Rule = Annotated[dict[str, str], AfterValidator(_check_rule)]  # axis → glob


class NightlyPolicy(_Strict):
    """`pcgh nightly`'s gate (harness/reports/policy.py) and which requested models join it; its flags override these."""

    keep: int = Field(default=3, ge=1, le=100, description="a regression passed in each of the last KEEP nightlies it ran in")
    window: int = Field(default=3, ge=1, le=30, description="nightlies per median for the graph-latency trend")
    latency_threshold: float = Field(default=0.15, ge=0, le=100, allow_inf_nan=False,
                                     description="relative growth of the median graph latency that fails the night")
    requests: str | None = Field(default=None, description="the variant (tiny, trim:N, full) at which every model request "
                                 "with a card joins the model axis, its status then set by the night; unset: none join")

    @field_validator("requests")
    @classmethod
    def _variant(cls, value: str | None) -> str | None:
        if value is not None:
            ModelRef.parse(f"card:{value}")  # ValueError naming the grammar
        return value


class Matrix(_Strict):
    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    defaults: Defaults = Defaults()
    axes: Axes
    include: list[Rule] = Field(default_factory=list, max_length=MAX_RULES,
                                description="if given, keep only cells matching a rule")
    exclude: list[Rule] = Field(default_factory=list, max_length=MAX_RULES, description="drop cells matching a rule")
    overrides: dict[str, Override] = Field(default_factory=dict, max_length=MAX_RULES,
                                           description="model glob → override")
    tiers: dict[str, Rule] = Field(default_factory=dict, max_length=MAX_RULES, description="tier name → filter rule")
    nightly: NightlyPolicy = NightlyPolicy()


def load_matrix(path: str | Path, cards_dir: Path = CARDS_DIR) -> Matrix:
    """Parse and validate a matrix file; errors name the file, the line, the field and what is allowed.

    Names are checked against the runtime's registries as they are now, after the PCG_PLUGINS plugins are imported.
    """
    p = Path(path)
    data, lines = load_yaml_with_lines(p, what="matrix file")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a matrix file is a YAML mapping with at least name and axes")
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_problems_text(p, lines, [(tuple(err["loc"]), _message(err)) for err in e.errors()])) from e
    problems = name_problems(matrix, cards_dir)
    if problems:
        problems.sort(key=lambda pr: line_of(lines, pr[0]) or 0)  # in the order of the file
        raise ConfigError(_problems_text(p, lines, problems))
    return matrix


def _message(err: Any) -> str:
    """pydantic's message, except for a key the schema does not have: that is a typo, so it gets the nearest key
    and the keys that mapping takes, where pydantic says only 'Extra inputs are not permitted'."""
    if err["type"] != "extra_forbidden" or not err["loc"]:
        return err["msg"]
    key, keys = str(err["loc"][-1]), _keys_at(err["loc"][:-1])
    if keys is None:
        return f"unknown key {key!r}"
    where = ".".join(str(x) for x in err["loc"][:-1]) or "a matrix file"
    return f"unknown key {key!r}{did_you_mean(key, keys)} ({where} takes: {', '.join(keys)})"


def _keys_at(loc: tuple) -> list[str] | None:
    """The keys the mapping at `loc` takes, walking Matrix's fields (through optionals, lists and dicts)."""
    node: Any = Matrix
    for part in loc:
        model = _model_of(node)
        if model is not None:
            if str(part) not in model.model_fields:
                return None
            node = model.model_fields[str(part)].annotation
        elif typing.get_origin(node) in (list, dict):
            node = typing.get_args(node)[-1]  # `part` is the index or the key
        else:
            return None
    model = _model_of(node)
    return None if model is None else list(model.model_fields)


def _model_of(node: Any) -> type[BaseModel] | None:
    """The model class `node` is, or is optionally (`X | None`, Annotated[X, …]); None otherwise."""
    if isinstance(node, type) and issubclass(node, BaseModel):
        return node
    if typing.get_origin(node) in (typing.Union, types.UnionType, Annotated):
        args = [a for a in typing.get_args(node) if a is not type(None)]
        return _model_of(args[0]) if args else None
    return None


def _problems_text(path: Path, lines: dict[tuple, int], problems: list[tuple[tuple, str]], most: int = 20) -> str:
    out = []
    for loc, msg in problems[:most]:
        field = ".".join(str(x) for x in loc) or "(top level)"
        out.append(f"{path}:{line_of(lines, loc) or '?'}: field {field}: {msg}")
    if len(problems) > most:
        out.append(f"… and {len(problems) - most} more")
    return "invalid matrix file:\n  " + "\n  ".join(out)
