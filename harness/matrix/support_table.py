"""The README's "What runs" table, rendered from the runtime's capability table (pcg_core.capabilities), so the front
door says what the pre-check says and cannot fall behind it: `python -m harness.matrix.support_table` prints it,
`--write README.md` puts it between the file's support-table markers, and tests/test_readme.py
fails when the committed README differs from what this renders. It lists what ships: the built-in attention and
capture backends, never a plugin registered in the process that renders it (the test suite registers fault
backends; a user's plugin is theirs, not the README's)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

START, END = "<!-- support-table:start -->", "<!-- support-table:end -->"
MARKED = re.compile(re.escape(START) + r"\n.*?" + re.escape(END), re.S)


def _short(arch: str) -> str:
    """`Qwen3MoeForCausalLM` → `Qwen3Moe`: the table's width is the README's."""
    return re.sub(r"For(CausalLM|ConditionalGeneration)$", "", arch)


def render(caps: dict[str, Any] | None = None) -> str:
    """Markdown: one row per architecture (its features, the attention backends that serve them, the capture
    backends that can hold them), then one line per other axis."""
    from pcg_core.capabilities import attention_unsupported_reason, capabilities, split_op_capture_reason
    from pcg_core.registry import ATTENTION_BACKENDS, CAPTURE_BACKENDS

    caps = caps if caps is not None else capabilities()
    attn = {a: b for a, b in caps["attention_backends"].items() if a in ATTENTION_BACKENDS.built_in}
    capture = [g for g in caps["capture_backends"] if g in CAPTURE_BACKENDS.built_in]
    cuda_only = [a for a, b in attn.items() if b["devices"].get("cpu")]
    rows = ["| architecture | features | attention | capture |", "|---|---|---|---|"]
    for arch, features in caps["architectures"].items():
        backends = [a for a in attn if attention_unsupported_reason(a, "cuda", features, attn) is None]
        graphs = [g for g in capture if split_op_capture_reason(g, features, caps) is None]
        rows.append(f"| {_short(arch)} | {', '.join(features) or '—'} | {', '.join(backends)} | {', '.join(graphs)} |")
    aliases = ", ".join(f"`{k}` read as `{v}`" for k, v in caps["model_type_aliases"].items())
    lines = [
        "",
        f"Model types: {aliases or 'none aliased'}. CUDA only: {', '.join(cuda_only) or 'none'}; the rest also run "
        "on a CPU.",
        "",
        f"- **quantization**: {', '.join(q for q in caps['quantization'] if q != 'none')}",
        f"- **checkpoint formats**: {', '.join(caps['quant_formats'])}",
        f"- **KV cache**: {', '.join(caps['kv_cache'])}",
        f"- **parallel**: {', '.join(caps['parallel'])}",
        f"- **compilers**: {', '.join(caps['compilers'])}; **dtypes**: {', '.join(caps['dtypes'])}",
    ]
    return "\n".join(rows + lines)


def replace(text: str, table: str) -> str:
    """`text` with the table between its markers; a text without them is an error, not a silent no-op."""
    if not MARKED.search(text):
        raise ValueError(f"no {START} … {END} block to put the support table in")
    return MARKED.sub(lambda _: f"{START}\n{table}\n{END}", text, count=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", metavar="FILE", type=Path, help="put the table between FILE's support-table markers")
    args = p.parse_args(argv)
    table = render()
    if args.write is None:
        print(table)
        return 0
    try:
        args.write.write_text(replace(args.write.read_text(encoding="utf-8"), table), encoding="utf-8")
    except (OSError, ValueError) as e:
        print(f"{args.write}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
