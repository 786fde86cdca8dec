"""Small Markdown helpers: reasons are long, multi-line and may contain pipes; tables must survive them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def one_line(text: Any, limit: int = 200) -> str:
    """First non-empty line of text, cut to limit characters (reasons can be 2,000-character tracebacks)."""
    s = "" if text is None else str(text)
    line = next((ln.strip() for ln in s.splitlines() if ln.strip()), "")
    if len(line) > limit or (line and len(s.strip()) > len(line)):
        line = line[:limit].rstrip() + "…"
    return line


def cell(text: Any) -> str:
    """Text made safe for a table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
