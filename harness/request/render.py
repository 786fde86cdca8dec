"""Readable output of `pcgh request` and `pcgh requests` (rich tables)."""

from __future__ import annotations

import sys
from typing import Any

from harness.request.quantization import describe
from harness.store.rows import RequestRow


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _bytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _request_words(r: dict[str, Any]) -> str:
    if not r.get("request_id"):
        return ""
    if r.get("requested_before"):
        return f" (already requested as #{r['request_id']}: its analysis refreshed, no second queue row)"
    return f" (request #{r['request_id']})"


def print_request(r: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    # "supported" is the architecture's; a setting asked for that does not run (--tp 2, --quant …) is said beside it
    not_ok = [axis for axis, v in r["verdicts"].items() if not v["ok"]]
    verdict = "supported" if r["supported"] else "not supported yet"
    if r["supported"] and not_ok:
        verdict += f", but not as asked: {', '.join(not_ok)} (below)"
    colour = "green" if r["supported"] and not not_ok else "yellow"
    rev = f"@{r['revision']}" if r.get("revision") else ""
    console.print(f"[bold]{r['model']}{rev}[/] — {r['architecture']} — [bold {colour}]{verdict}[/]" + _request_words(r))
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("features", ", ".join(r["features"]) or "none")
    for name, d in r["feature_details"].items():
        t.add_row(f"  {name}", ", ".join(f"{k}={v}" for k, v in d.items() if v is not None))
    t.add_row("quantization", describe(r["quantization"]))
    t.add_row("dtype", str(r.get("dtype")))
    t.add_row("params", f"{_size(r['params'])} total, {_size(r['active_params'])} active per token, "
                        f"{_size(r['non_embedding_params'])} non-embedding")
    if r["memory_bytes"]:
        t.add_row("weights", ", ".join(f"{k} {_bytes(v)}" for k, v in r["memory_bytes"].items()))
        t.add_row("H200s (bf16)", f"{r['h200s']}  (bf16 weights + 10% headroom, 141 GB each)")
    if g := r.get("graph_memory"):
        pools = ", ".join(f"{k} {v['pool_bytes'] / 2**30:.2f}" for k, v in g["by_graph"].items())
        t.add_row(f"graphs ({g['max_tokens']} tok)", f"{pools} GiB per GPU at tp{g['tp']}  (estimated: fitted to "
                  f"{g['calibration_cells']} pools measured on the {g['gpu']}, 90% within {g['band'][0]:.1f}–"
                  f"{g['band'][1]:.1f}×)")
        if not g["weights_fit"]:
            t.add_row("KV context", f"none: the weights ({g['weights_bytes'] / 2**30:.0f} GiB per GPU at tp{g['tp']}) "
                      f"fill an {g['gpu']}'s {g['budget_bytes'] / 2**30:.0f} GiB (90% of it)")
        elif g["context_tokens_without_graphs"] is not None:
            ctx = ", ".join(f"{k} {v['context_tokens']:,}" for k, v in g["by_graph"].items())
            t.add_row("KV context", f"{ctx} tokens per {g['gpu']} beside weights and graphs; "
                      f"{g['context_tokens_without_graphs']:,} without graphs (90% of the GPU)")
    t.add_row("TP sizes", (", ".join(map(str, r["tp_sizes"])) or "none up to 8") + "  (dividing the heads; which run: parallel)")
    if r["ep_sizes"]:
        t.add_row("EP sizes", ", ".join(map(str, r["ep_sizes"])))
    if r.get("card_id"):
        t.add_row("card", r["card_id"] + (f" (written: {r['card']['path']})" if r.get("card") else ""))
    console.print(t)
    v = Table("axis", "ok", "reason")
    for axis, verdict in r["verdicts"].items():
        v.add_row(axis, "[green]yes[/]" if verdict["ok"] else "[red]no[/]", verdict["reason"])
    console.print(v)
    for d in r.get("duplicates") or []:
        console.print(f"[yellow]duplicate of request #{d['id']}[/] ({d['created_at']}, {' and '.join(d['match'])}, status {d['status']})")
    for note in r["notes"]:
        console.print(f"note: {note}")
    if r.get("submitted"):
        console.print(f"submitted to {r['submitted']['url']}: HTTP {r['submitted']['status']}")


def print_requests(rows: list[RequestRow], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if sys.stdout.isatty() else 200)  # piped: do not fold at 80 columns
    if not rows:
        console.print("no model requests yet; `pcgh request MODEL` records one")
        return
    t = Table("id", "created", "model", "revision", "architecture", "supported", "status", "card", "last nightly")
    for r in rows:
        o = r.outcome
        t.add_row(str(r.id), r.created_at.strftime("%Y-%m-%d %H:%M"), r.model, r.revision or "",
                  r.architecture, "yes" if r.supported else "no", r.status, r.card_id or "",
                  f"run {o.run_id}: {o.reason}" if o else "")
    console.print(t)
