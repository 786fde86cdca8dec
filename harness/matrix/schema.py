"""The matrix file schema (harness/configs/*.yaml), validated on load.

A matrix names the axes to sweep, the defaults every cell starts from, include/exclude rules (glob patterns
per axis), per-model overrides (tolerances, limits, which axis values apply) and named tiers (filters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from harness.matrix.yaml_lines import line_of, load_yaml_with_lines
from harness.outcome import AXES, ModelRef
from pcg_core.config import COMPILERS
from pcg_core.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Tolerances(_Strict):
    logprob: float | None = Field(default=None, gt=0, description="max |Δlogprob| on agreeing positions")


class Defaults(_Strict):
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    prompt_suite: Literal["edges"] = "edges"
    max_new_tokens: PositiveInt = 8
    top_k: PositiveInt = 5
    max_tokens: PositiveInt = 4096
    timeout_s: PositiveInt = 900
    seed: int = 0
    tolerances: Tolerances = Tolerances()


class Axes(_Strict):
    model: list[str] = Field(min_length=1)
    quant: list[str] = Field(default_factory=lambda: ["none"], min_length=1)
    attention: list[str] = Field(default_factory=lambda: ["sdpa"], min_length=1)
    parallel: list[str] = Field(default_factory=lambda: ["tp1"], min_length=1)
    graph: list[str] = Field(default_factory=lambda: ["piecewise"], min_length=1)
    compiler: list[str] = Field(default_factory=lambda: ["eager"], min_length=1)

    @field_validator("model")
    @classmethod
    def _model_variant(cls, values: list[str]) -> list[str]:
        for v in values:
            ModelRef.parse(v)  # ValueError naming the grammar
        return values

    @field_validator("compiler")
    @classmethod
    def _compiler(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if v not in COMPILERS]
        if bad:
            raise ValueError(f"unknown compiler(s) {bad}; allowed: {', '.join(COMPILERS)}")
        return values


class Override(_Strict):
    tolerances: Tolerances | None = None
    max_tokens: PositiveInt | None = None
    max_new_tokens: PositiveInt | None = None
    timeout_s: PositiveInt | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    axes: dict[str, list[str]] = Field(default_factory=dict, description="axis values this model is limited to")

    @field_validator("axes")
    @classmethod
    def _axes_known(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        bad = [a for a in value if a not in AXES or a == "model"]
        if bad:
            raise ValueError(f"unknown axis {bad}; limits may name {', '.join(a for a in AXES if a != 'model')}")
        return value


def _check_rule(rule: dict[str, str]) -> dict[str, str]:
    bad = [a for a in rule if a not in AXES]
    if bad:
        raise ValueError(f"rule {rule} names unknown axis {bad}; axes are {', '.join(AXES)}")
    return rule


Rule = Annotated[dict[str, str], AfterValidator(_check_rule)]  # axis → glob


class Matrix(_Strict):
    name: str
    description: str = ""
    defaults: Defaults = Defaults()
    axes: Axes
    include: list[Rule] = Field(default_factory=list, description="if given, keep only cells matching a rule")
    exclude: list[Rule] = Field(default_factory=list, description="drop cells matching a rule")
    overrides: dict[str, Override] = Field(default_factory=dict, description="model glob → override")
    tiers: dict[str, Rule] = Field(default_factory=dict, description="tier name → filter rule")



def load_matrix(path: str | Path) -> Matrix:
    """Parse and validate a matrix file; errors name the file, the line, the field and what is allowed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such matrix file (see harness/configs/ for examples)")
    data, lines = load_yaml_with_lines(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a matrix file is a YAML mapping with at least name and axes")
    try:
        return Matrix.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(err["loc"])
            line = line_of(lines, loc)
            field = ".".join(str(x) for x in loc) or "(top level)"
            problems.append(f"{p}:{line or '?'}: field {field}: {err['msg']}")
        raise ConfigError("invalid matrix file:\n  " + "\n  ".join(problems)) from e
