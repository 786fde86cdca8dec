"""A cell's outcome: the one value that flows from the cell through the worker, the store and the reports to the
dashboard, and the words it is made of (statuses, axes, the model reference).

Everything downstream of the cell reads these types instead of guessing at dict keys, and this module imports
nothing from the runtime, so the store, the reports and the dashboard never pull in torch to know what "pass"
means.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator

from harness.metrics import CellMetrics, StoredModel

from pcg_core.quant.schemes import registry as quant_registry


class Status(StrEnum):
    """What happened to a cell. Only `pass` and `pass_flaky` pass; see NOT_COUNTED for the pass rate."""

    PASS = "pass"
    PASS_FLAKY = "pass_flaky"  # failed, then passed on the retry
    FAIL_ACCURACY = "fail_accuracy"
    FAIL_CAPTURE = "fail_capture"
    FAIL_RUN = "fail_run"
    TIMEOUT = "timeout"
    OOM = "oom"
    EAGER_FAIL = "eager_fail"  # the reference itself failed: nothing to judge the graph against
    EAGER_NONDETERMINISTIC = "eager_nondeterministic"  # eager vs eager beyond the judge's bounds
    UNSUPPORTED = "unsupported"  # decided before launch, with the reason
    SKIPPED = "skipped"


STATUSES: tuple[str, ...] = tuple(s.value for s in Status)
PASSING: tuple[str, ...] = (Status.PASS, Status.PASS_FLAKY)
# Shown, but not counted against the pass rate: the graph path was never judged.
NOT_COUNTED: tuple[str, ...] = (Status.EAGER_FAIL, Status.UNSUPPORTED, Status.SKIPPED)
# A retry cannot change these: they passed, were never run, or fail the same way whatever the graph does.
NOT_RETRIED: tuple[str, ...] = (*PASSING, Status.UNSUPPORTED, Status.SKIPPED, Status.EAGER_FAIL, Status.EAGER_NONDETERMINISTIC)

# A cell is one point of these axes.
AXES = ("model", "quant", "attention", "parallel", "graph", "compiler", "kv_cache", "engine")
# Axes added after runs were stored, with the value every cell had before: a record without the axis holds it, and
# a cell at that value keeps the key it had before the axis existed (so stored runs still read and compare).
AXIS_DEFAULTS: dict[str, str] = {"kv_cache": "auto", "engine": "pcg"}
# The runtimes a cell can put under graphs: pcg's own engine, or an SGLang server (harness/sglang/).
ENGINES = ("pcg", "sglang")

_VARIANT = re.compile(r"^(full|tiny|trim:([1-9][0-9]*))$")
VARIANT_GRAMMAR = "full, tiny or trim:N (N ≥ 1)"


@dataclass(frozen=True)
class ModelRef:
    """The `model` axis value `card:variant`: a model card and the size it runs at.

    full: the real model (real weights); tiny: CPU-sized widths, synthetic weights; trim:N: the first N decoder
    layers at real widths, synthetic weights.
    """

    card: str
    variant: str
    layers: int | None = None  # trim:N

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        card, _, variant = str(text).partition(":")
        m = _VARIANT.match(variant)
        if not card or m is None:
            raise ValueError(f"model {text!r}: write it as CARD:VARIANT with VARIANT one of {VARIANT_GRAMMAR}")
        return cls(card, variant, int(m.group(2)) if m.group(2) else None)

    def __str__(self) -> str:
        return f"{self.card}:{self.variant}"

    @property
    def tiny(self) -> bool:
        return self.variant == "tiny"

    @property
    def weights(self) -> str:
        """`real` for the full model, `synthetic` for the shrunk variants."""
        return "real" if self.variant == "full" else "synthetic"


def cell_key(axes: dict[str, str]) -> str:
    """The stable key of the cell at these axes: an axis of AXIS_DEFAULTS at its default (or absent) is left out,
    so a cell's key is the one it had before that axis existed."""
    return "|".join(f"{a}={axes[a]}" for a in AXES
                    if a not in AXIS_DEFAULTS or axes.get(a, AXIS_DEFAULTS[a]) != AXIS_DEFAULTS[a])


def with_default_axes(axes: Mapping[str, str]) -> dict[str, str]:
    """`axes` with every AXIS_DEFAULTS axis it lacks at its default (a record stored before the axis existed)."""
    return {**AXIS_DEFAULTS, **axes} if isinstance(axes, Mapping) else axes


def canonical_key(key: str) -> str:
    """`key` with the quant axis in today's spelling (fp4, NVFP4's name before the scheme registry, is nvfp4): what
    cells of different runs are matched by, while each record keeps, and reports show, the key it was stored under."""
    parts = key.split("|")
    return "|".join(f"quant={quant_registry.canonical(p[6:])}" if p.startswith("quant=") else p for p in parts)


def key_spellings(key: str) -> list[str]:
    """`key` and every spelling a store may hold it under (the quant axis by an alias): for lookups by key."""
    out = [key]
    for alias, name in quant_registry.ALIASES.items():
        if f"|quant={name}|" in f"|{key}|":
            out.append(f"|{key}|".replace(f"|quant={name}|", f"|quant={alias}|")[1:-1])
    return out


MAX_ATTEMPT = 100  # a cell runs once and is retried once; anything near this is not an attempt number
LOG_KEEP = 200_000  # characters of a cell's log a record keeps: the end, where the error is


def _encodable(text: str) -> str:
    """The text, if UTF-8 can hold it (a lone surrogate cannot, and no database stores one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{text[:40]!r} is not valid text (a lone surrogate at {e.start})") from None
    return text


class CellOutcome(StoredModel):
    """A cell's status, why, what it measured and how long it took: what `run_cell` returns."""

    status: Status
    reason: str = ""
    metrics: CellMetrics = Field(default_factory=CellMetrics)
    duration_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def to_json(self) -> str:
        """JSON text; NaN stays NaN (Python's json reads it back), so a measured NaN is not lost on the way."""
        return json.dumps(self.model_dump(mode="python"))

    @classmethod
    def from_json(cls, text: str) -> CellOutcome:
        return cls.model_validate(json.loads(text))


class CellRecord(CellOutcome):
    """One attempt at one cell of one run, as the store keeps it: the outcome plus its key, axes, attempt and log."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=2000)
    axes: dict[str, str]
    attempt: int = Field(default=1, ge=1, le=MAX_ATTEMPT)
    log: str = ""

    @field_validator("axes", mode="before")
    @classmethod
    def _axes_added_later(cls, axes: Any) -> Any:
        return with_default_axes(axes)

    @field_validator("axes")
    @classmethod
    def _all_axes(cls, axes: dict[str, str]) -> dict[str, str]:
        if set(axes) != set(AXES):
            raise ValueError(f"axes must have exactly {', '.join(AXES)}, got {', '.join(axes) or 'none'}")
        for value in axes.values():
            _encodable(value)
        return axes

    @field_validator("key")
    @classmethod
    def _key_text(cls, key: str) -> str:
        return _encodable(key)

    @field_validator("log")
    @classmethod
    def _log_tail(cls, log: str) -> str:
        return log[-LOG_KEEP:]

    @classmethod
    def of(cls, key: str, axes: dict[str, str], outcome: CellOutcome, *, attempt: int = 1, log: str = "") -> CellRecord:
        return cls(key=key, axes=axes, attempt=attempt, log=log, **dict(outcome))

    @property
    def model(self) -> ModelRef:
        return ModelRef.parse(self.axes["model"])

    @classmethod
    def read(cls, row: Mapping[str, Any]) -> CellRecord:
        """A record as a store holds it: strict about everything but the metrics, read leniently
        (CellMetrics.lenient), since a writer may have stored them before they had a type."""
        try:
            return cls.model_validate(row)
        except ValidationError:
            return cls.model_validate({**row, "metrics": CellMetrics.lenient(row.get("metrics"))})
