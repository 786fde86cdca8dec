"""How one cell is shown: its colour class, its short label, its tooltip and its history's flips. Pure
functions, shared by the pages and the JSON API so the two never disagree.

Colours follow harness/reports' status classes (pass, flaky, fail, eager_fail, not_run), so the matrix page and
the Markdown support matrices classify a status the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from pydantic import BaseModel

from harness.reports.markdown import one_line
from harness.reports.stats import is_passing, status_class

# Failing and not-run statuses, in a few characters: a matrix cell is ~4em wide.
SHORT = {"fail_accuracy": "acc", "fail_capture": "cap", "fail_run": "run", "timeout": "T/O", "oom": "OOM",
         "eager_fail": "eager", "eager_nondeterministic": "nondet", "unsupported": "n/s", "skipped": "skip"}
MIB = 2**20
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str, any surrogate is a lone one: UTF-8 cannot hold it


def scrub(v: Any) -> Any:
    """`v` with every lone surrogate in its text (nested too) replaced by U+FFFD. Uploads refuse them now; a row
    stored before that must still render, not take its page down with a UnicodeEncodeError."""
    if isinstance(v, str):
        return _SURROGATE.sub("\ufffd", v) if _SURROGATE.search(v) else v
    if isinstance(v, dict):
        return {scrub(k): scrub(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [scrub(x) for x in v]
    if isinstance(v, BaseModel):  # a store row: its fields scrubbed, its type kept
        return v.model_copy(update={k: scrub(getattr(v, k)) for k in type(v).model_fields})
    return v


def css_class(status: str) -> str:
    """s-pass, s-flaky, s-fail, s-eager_fail or s-not_run (web/static/style.css colours them)."""
    return f"s-{status_class(status)}"


def short_label(status: str, speedup: float | None) -> str:
    """'2.31×' for a pass with timings, '~2.31×' for pass_flaky, else a short status word."""
    if is_passing(status):
        text = f"{speedup:.2f}×" if speedup is not None else "pass"
        return text if status == "pass" else f"~{text}"
    return SHORT.get(status, status)


def fmt_bytes(n: float | None) -> str:
    return "n/a" if n is None or not math.isfinite(n) else f"{n / MIB:.1f} MiB"


def tooltip(status: str, reason: str, speedup: float | None, capture_s: float | None, pool_bytes: float | None,
            token_match: float | None) -> str:
    """Hover text: status, the reason's first line, and the metrics a reader checks first. Not the key: the
    row and column headers name it, and 10,000 repeated keys would be a third of the page."""
    lines = [status + (f": {one_line(reason, 200)}" if reason else "")]
    metrics = []
    if speedup is not None:
        metrics.append(f"speedup {speedup:.2f}×")
    if capture_s is not None:
        metrics.append(f"capture {capture_s:.2f} s")
    if pool_bytes is not None:
        metrics.append(f"pool {fmt_bytes(pool_bytes)}")
    if token_match is not None:
        metrics.append(f"token match {token_match:.3f}")
    if metrics:
        lines.append(" · ".join(metrics))
    return "\n".join(lines)


def flips(statuses: Sequence[str]) -> int:
    """How often the status changed from one run to the next."""
    return sum(a != b for a, b in pairwise(statuses))


def is_flaky(statuses: Sequence[str]) -> bool:
    """Passed only on retry in some run, or went between passing and not passing more than once."""
    passing = [is_passing(s) for s in statuses]
    return "pass_flaky" in statuses or sum(a != b for a, b in pairwise(passing)) >= 2
