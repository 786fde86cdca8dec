"""Kernel tuning tables as data: each Triton GEMM's launch configurations by token count, per GPU name.

Why data, not code: a table is what a sweep on one GPU chose (`benchmarks/*_gemm.py --sweep`), so it belongs to
that GPU, and a new GPU's table is a new entry, not an edit of the kernel (vLLM keeps its fused-MoE configs the same
way). Each `configs/<kernel>.json` holds `fields` (what a row's numbers are), `gpus` (GPU name as
`torch.cuda.get_device_name()` says it → `source` and `rows`: `[up to M, [numbers…]]`, the last `up to` null) and
`default` (the entry a GPU without its own uses). The measured history behind each entry is benchmarks/README.md's.

Tables are fixed, never autotuned at run time, so a capture never benchmarks; the GPU's name is read when a kernel
first launches (no CUDA call at import).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

from pcg_core.errors import ConfigError

CONFIGS_DIR = Path(__file__).with_name("configs")
UNBOUNDED = 1 << 62


def _gpu_name() -> str | None:
    return torch.cuda.get_device_name(torch.cuda.current_device()) if torch.cuda.is_available() else None


def _check(path: Path, data: Any) -> None:
    """A malformed table is an error naming the file and the entry, never a silently wrong launch."""
    where = str(path)
    if not isinstance(data, dict) or not {"fields", "gpus", "default"} <= data.keys():
        raise ConfigError(f"{where}: a tuning table needs fields, gpus and default")
    if data["default"] not in data["gpus"]:
        raise ConfigError(f"{where}: default {data['default']!r} is not one of its gpus ({', '.join(data['gpus'])})")
    width = len(data["fields"])
    for gpu, entry in data["gpus"].items():
        rows = entry.get("rows") if isinstance(entry, dict) else None
        if not rows:
            raise ConfigError(f"{where}: gpus[{gpu!r}] has no rows")
        tops = [top for top, _ in rows]
        if tops[-1] is not None or any(t is None for t in tops[:-1]) or tops[:-1] != sorted(set(tops[:-1])):
            raise ConfigError(f"{where}: gpus[{gpu!r}] rows must rise by token count and end with null (no limit)")
        for top, cfg in rows:
            if len(cfg) != width or not all(isinstance(v, int) and v > 0 for v in cfg):
                raise ConfigError(f"{where}: gpus[{gpu!r}] row up to {top}: {cfg} is not {width} positive integers "
                                  f"({', '.join(data['fields'])})")


@cache
def load(kernel: str) -> dict[str, Any]:
    """The kernel's whole table, checked."""
    path = CONFIGS_DIR / f"{kernel}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read the tuning table ({e})") from e
    _check(path, data)
    return data


@cache
def configs(kernel: str, gpu: str | None = "") -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(up to M, config) rows for GPU `gpu` (default: this process's CUDA device; None or a GPU without an entry: the
    table's default), the last row unbounded."""
    data = load(kernel)
    name = _gpu_name() if gpu == "" else gpu
    entry = data["gpus"].get(name) or data["gpus"][data["default"]]
    return tuple((UNBOUNDED if top is None else top, tuple(cfg)) for top, cfg in entry["rows"])


def pick(kernel: str, m: int) -> tuple[int, ...]:
    """The config of the first row whose `up to` holds `m`."""
    return next(cfg for top, cfg in configs(kernel) if m <= top)
