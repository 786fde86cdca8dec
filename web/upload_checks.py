"""What an upload must be before anything of it is written: what `pcgh run` itself would have recorded.

The types (harness.outcome.CellRecord, harness.request.schema.RequestReport) check shapes; an upload is a
stranger's JSON, so it is also held to the values a run can produce: text UTF-8 can store (no lone surrogates)
and of bounded length, numbers finite and in their field's range, the model axis in the card grammar, a key equal
to the one its axes give, and no times in the future. Each check names the place (a JSON path) and what to send
instead, so a 422 tells the sender what to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, UTC
from typing import Any

from harness.metrics import GROUPS
from harness.outcome import CellRecord, ModelRef, canonical_key, cell_key
from pcg_core.known import parse_parallel

TEXT_MAX = 20_000  # characters of one string in metrics, a provenance value or a request report
REASON_MAX = 200_000  # a cell's reason (the judge's divergences can be long); its log is cut to LOG_KEEP anyway
AXIS_MAX = 200  # an axis value
MODEL_ID_MAX = 1_000  # a request's model: a hub id (org/name, ≤ 96 + 96) or the local path asked about
CLOCK_SKEW = timedelta(minutes=10)  # a sender's clock may run this far ahead of ours
SAFE_INT = 2**53  # integers JSON readers hold exactly
_AXIS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # backends, schemes, compilers, KV dtypes
_SURROGATE = re.compile("[\ud800-\udfff]")

# Each metric's range: (low, high, non-finite allowed). A judge measurement may be NaN or infinite (a logprob of
# -inf, a NaN forward): that is what the cell found, recorded as found. A time, a size or a speedup cannot be.
_SECONDS = (0.0, 1e6, False)
_RANGES: dict[str, tuple[float, float, bool]] = {
    "speedup": (1e-6, 1e4, False),  # graph over eager: 10,000× is not a measurement
    "latency_ms": (0.0, 1e7, False),
    "trace_s": _SECONDS, "capture_s": _SECONDS, "compile_s": _SECONDS, "cell_s": _SECONDS, "phase_s": _SECONDS,
    "token_match": (0.0, 1.0, False),
    "graph_pool_bytes": (0, 2**50, False), "kv_bytes_per_token": (0, 2**40, False),
    "pieces": (0, 10**6, False), "graphs_captured": (0, 10**6, False), "eager_fallbacks": (0, 10**9, False),
    "layers": (0, 10**5, False), "quant_layers": (0, 10**7, False), "max_tokens": (0, 2**31, False),
    "max_new_tokens": (0, 2**31, False), "top_k": (0, 2**31, False), "repeats": (0, 10**6, False),
    "bucket_hits": (0, SAFE_INT, False), "seed": (-SAFE_INT, SAFE_INT, False),
}
_MEASURED = (0.0, float("inf"), True)  # diffs, KLs, noise, tolerances: ≥ 0, or not finite as measured
_DEFAULT = (-1e15, 1e15, False)
_MEASURED_PREFIXES = ("max_", "padding_", "tie_margin", "logprob_tol", "quant_logprob_diff", "reference",
                      "eager_self_diff", "coverage", "checkpoint_kv_scales")


class UploadError(ValueError):
    """An upload value a run could not have recorded; the message names its JSON path."""


def walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, leaf) for every leaf of a JSON-like value; dict keys are leaves too (text that gets stored)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{path}.<key>", k
            yield from walk(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")
    else:
        yield path, value


def check_text(path: str, text: str, limit: int = TEXT_MAX) -> None:
    if m := _SURROGATE.search(text):
        raise UploadError(f"{path}: not valid text (a lone surrogate at {m.start()}); send UTF-8 text")
    if len(text) > limit:
        raise UploadError(f"{path}: {len(text):,} characters, over the {limit:,} this field keeps; send less")


def check_tree(value: Any, path: str, limit: int = TEXT_MAX, finite: bool = True) -> None:
    """Every string of `value` valid and at most `limit` long; every number finite (with `finite`) and an
    integer within what JSON readers hold."""
    for where, leaf in walk(value, path):
        if isinstance(leaf, str):
            check_text(where, leaf, limit)
        elif isinstance(leaf, bool) or leaf is None:
            continue
        elif isinstance(leaf, int) and abs(leaf) > SAFE_INT:
            raise UploadError(f"{where}: {leaf} is past ±2^53; send a number JSON readers hold exactly")
        elif isinstance(leaf, float) and finite and not math.isfinite(leaf):
            raise UploadError(f"{where}: {leaf} is not a finite number")


def _range_of(field: str) -> tuple[float, float, bool]:
    if field in _RANGES:
        return _RANGES[field]
    return _MEASURED if field.startswith(_MEASURED_PREFIXES) else _DEFAULT


def check_metrics(metrics: dict[str, Any], path: str) -> None:
    """Each metric number within its field's range (_RANGES), each string valid and bounded; a group
    (harness.metrics.GROUPS) holds metrics by name."""
    for field, value in metrics.items():
        if field in GROUPS and isinstance(value, dict):
            check_metrics(value, f"{path}.{field}")
            continue
        low, high, nonfinite_ok = _range_of(field)
        for where, leaf in walk(value, f"{path}.{field}"):
            if isinstance(leaf, str):
                check_text(where, leaf)
            elif where.endswith(".<key>"):  # a token count or a bucket: the type already holds it to an int
                continue
            elif isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
                if not math.isfinite(leaf):
                    if nonfinite_ok:
                        continue
                    raise UploadError(f"{where}: {leaf} is not a finite number")
                if not low <= leaf <= high:
                    raise UploadError(f"{where}: {leaf:g} is outside this field's range [{low:g}, {high:g}]")


def check_axes(axes: dict[str, str], path: str) -> None:
    for axis, value in axes.items():
        check_text(f"{path}.{axis}", value, AXIS_MAX)
        try:
            if axis == "model":
                ModelRef.parse(value)
            elif axis == "parallel":
                parse_parallel(value)
            elif not _AXIS_NAME.match(value):
                raise ValueError(f"{value!r} is not a name (letters, digits and _ . + -)")
        except ValueError as e:
            raise UploadError(f"{path}.{axis}: {e}") from None


def check_cell(record: CellRecord, path: str = "results[]") -> None:
    """A cell as `pcgh run` records it: axes in their grammar, the key its axes give, metrics in range."""
    check_axes(record.axes, f"{path}.axes")
    want = cell_key(record.axes)
    if canonical_key(record.key) != canonical_key(want):
        raise UploadError(f"{path}.key: {record.key[:200]!r} is not the key of its axes; send {want!r}")
    check_text(f"{path}.reason", record.reason, REASON_MAX)
    check_metrics(record.metrics.model_dump(mode="python", exclude_defaults=True), f"{path}.metrics")


def check_not_future(path: str, when: datetime | None, now: datetime | None = None) -> None:
    now = now or datetime.now(UTC)
    if when is not None and when > now + CLOCK_SKEW:
        raise UploadError(f"{path}: {when.isoformat()} is in the future (it is {now.isoformat(timespec='seconds')} "
                          "here); send the time the run really started and finished, with its time zone")
