"""benchmarks/lists_rest.py: which cells a device session still owes. A record from before the reference layer,
or one whose reference was not measured, must not count under --reference; an FP8-KV cell must not stand in for
the same cell with a 16-bit cache; a record stored as `fp4` is the nightly's `nvfp4`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from lists_rest import key, line_key, recorded  # noqa: E402


def _record(path: Path, rows: list[dict]) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _row(status="pass", ref=None, kv=None, quant="fp8_block", device="cuda"):
    spec = {"model": "qwen2.5-0.5b", "tiny": False, "layers": 24, "attention": "flex", "graph": "piecewise",
            "compiler": "eager", "quant": quant, "max_tokens": 4096, "device": device}
    if kv:
        spec["kv_cache"] = kv
    return {"spec": spec, "status": status, "metrics": {"reference": ref} if ref else {}}


CELL = key("qwen2.5-0.5b", "24", "flex", "piecewise", "eager", "fp8_block", 4096)


def test_reference_counts_only_cells_whose_reference_layer_passed(tmp_path):
    old = _record(tmp_path / "old.jsonl", [_row()])
    unmeasured = _record(tmp_path / "oom.jsonl", [_row(ref={"status": "not_measured"})])
    failed = _record(tmp_path / "fail.jsonl", [_row(status="fail_accuracy", ref={"status": "fail"})])
    good = _record(tmp_path / "good.jsonl", [_row(ref={"status": "pass"})])
    assert CELL in recorded([old], passed=True, device="cuda")
    for path in (old, unmeasured, failed):
        assert CELL not in recorded([path], passed=True, device="cuda", reference=True), path
    assert CELL in recorded([good], passed=True, device="cuda", reference=True)
    assert CELL not in recorded([good], passed=True, device="cpu", reference=True)


def test_kv_cache_and_scheme_spelling_are_part_of_the_key(tmp_path):
    fp8_kv = _record(tmp_path / "kv.jsonl", [_row(kv="fp8_e4m3", ref={"status": "pass"})])
    assert CELL not in recorded([fp8_kv], passed=True)
    assert line_key("qwen2.5-0.5b:24 flex piecewise eager fp8_block 4096 fp8_e4m3") in recorded([fp8_kv], passed=True)
    old_name = _record(tmp_path / "fp4.jsonl", [_row(quant="fp4")])
    assert line_key("qwen2.5-0.5b:24 flex piecewise eager nvfp4 4096") in recorded([old_name], passed=True)
