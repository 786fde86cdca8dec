"""Progress where nobody watches a terminal (CI logs, pipes): one plain line per finished cell, not a bar."""

from __future__ import annotations

import io
from collections import Counter

from harness.launcher.progress import RunProgress


def test_plain_lines_when_not_a_terminal() -> None:
    out, counts = io.StringIO(), Counter()
    with RunProgress(2, counts, stream=out) as p:
        counts["pass"] += 1
        p.advance("model=a|graph=full", "pass")
        counts["fail_run"] += 1
        p.advance("model=b|graph=full", "fail_run")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in out.getvalue()
    assert lines[0].startswith("[1/2] pass model=a|graph=full · elapsed 0:00:00, ETA 0:00:00 · pass:1")
    assert lines[1].startswith("[2/2] fail_run model=b|graph=full") and lines[1].endswith("fail_run:1 pass:1")


def test_silent_when_disabled() -> None:
    out = io.StringIO()
    with RunProgress(1, Counter(), enabled=False, stream=out) as p:
        p.advance("k", "pass")
    assert out.getvalue() == ""
