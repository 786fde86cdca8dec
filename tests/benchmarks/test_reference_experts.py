"""benchmarks/reference_experts.py on the CPU at small widths: both forms of the experts' reference compute the same
and the routed one runs fewer experts (the timing itself is the device's)."""

from __future__ import annotations

import json

from benchmarks.reference_experts import CONFIG, main


def test_the_routed_and_dense_references_agree_and_the_benchmark_prints_their_ratio(tmp_path, capsys):
    cfg = json.loads(open(CONFIG).read())
    cfg.update(num_experts=16, hidden_size=256, moe_intermediate_size=128)  # 128-wide blocks, a handful of experts
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rows = main(["--config", str(path), "--tokens", "1", "4", "--repeat", "1", "--device", "cpu"])
    assert [r["tokens"] for r in rows] == [1, 4]
    assert all(r["rel_diff"] <= 1e-5 and r["experts_routed"] < r["experts"] == 16 for r in rows)
    assert rows[0]["experts_routed"] == cfg["num_experts_per_tok"]  # one token: its top-k
    assert "×); relative difference" in capsys.readouterr().out
