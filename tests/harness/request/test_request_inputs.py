"""`pcgh request` on good and broken inputs: hub ids (offline, cached), directories, files; exit codes 0 and 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.request.analyze import analyze
from request_helpers import REPO_CONFIGS, cache_config, load_config

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_json_output_has_the_promised_keys(request_json):
    r = request_json(REPO_CONFIGS / "Qwen__Qwen3-30B-A3B.json")
    for key in ("architecture", "supported", "features", "quantization", "params", "active_params", "memory_bytes",
                "tp_sizes", "verdicts", "config_hash", "request_id", "duplicates"):
        assert key in r, key
    assert r["supported"] is True and r["features"] == ["moe"] and r["quantization"] is None
    assert set(r["memory_bytes"]) == {"float32", "bfloat16", "fp8", "int4"}
    assert all(set(v) == {"ok", "reason"} for v in r["verdicts"].values())
    assert r["source"] == "local" and r["request_id"] == 1


def test_a_model_directory(request_json, tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text((REPO_CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    r = request_json(d)
    assert r["architecture"] == "Qwen3ForCausalLM" and r["model"] == str(d.resolve())


def test_table_output(pcgh, db):
    rc, out, err = pcgh("request", REPO_CONFIGS / "openai__gpt-oss-120b.json", "--db", db)
    assert rc == 0, err
    for text in ("GptOssForCausalLM", "mxfp4 supported by the runtime; checkpoint: mxfp4", "moe, sliding_window, sinks, rope_scaling", "attention", "graph"):
        assert text in out, text


def test_hub_id_from_the_local_cache_offline(request_json, offline):
    cfg = load_config("Qwen__Qwen3-0.6B.json")
    cache_config(offline, "pcg-test/Tiny-Qwen", cfg, COMMIT, refs=("main", "v1"))
    r = request_json("pcg-test/Tiny-Qwen")
    assert (r["model"], r["source"], r["revision"], r["architecture"]) == ("pcg-test/Tiny-Qwen", "hub", None, "Qwen3ForCausalLM")
    assert request_json("pcg-test/Tiny-Qwen", "--revision", COMMIT)["revision"] == COMMIT


def test_hub_fetches_only_config_json(request_json, monkeypatch, tmp_path):
    import huggingface_hub

    calls = []
    path = _write(tmp_path, "config.json", json.dumps(load_config("Qwen__Qwen3-0.6B.json")))

    def fake_download(repo_id, filename, revision=None, **kw):
        calls.append((repo_id, filename, revision))
        return str(path)

    def no_snapshot(*a, **kw):
        raise AssertionError("the request command must not download weights")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_snapshot)
    r = request_json("Qwen/Qwen3-0.6B", "--revision", "main")
    assert calls == [("Qwen/Qwen3-0.6B", "config.json", "main")]
    assert r["revision"] == "main" and r["card_id"] == "qwen3-0.6b"  # an existing card covers this hub id


def test_unreachable_hub_id_offline_is_exit_2(pcgh, db, offline):
    rc, out, err = pcgh("request", "pcg-test-org/no-such-model-xyz", "--db", db)
    assert rc == 2 and out == ""
    assert "pcg-test-org/no-such-model-xyz" in err and "not in the local cache and the hub cannot be reached" in err
    assert "HF_HUB_OFFLINE=1" in err


def test_nonexistent_path_is_exit_2(pcgh, db, tmp_path):
    missing = tmp_path / "nowhere" / "config.json"
    rc, _, err = pcgh("request", missing, "--db", db)
    assert rc == 2
    assert str(missing) in err and "not a hub id" in err


def test_directory_without_config_is_exit_2(pcgh, db, tmp_path):
    rc, _, err = pcgh("request", tmp_path, "--db", db)
    assert rc == 2 and "no config.json there" in err


def test_non_json_file_is_exit_2(pcgh, db, tmp_path):
    p = _write(tmp_path, "config.json", "{not json")
    rc, _, err = pcgh("request", p, "--db", db)
    assert rc == 2 and str(p) in err and "not valid JSON" in err


def test_json_list_is_exit_2(pcgh, db, tmp_path):
    p = _write(tmp_path, "config.json", json.dumps([load_config("Qwen__Qwen3-0.6B.json")]))
    rc, _, err = pcgh("request", p, "--db", db)
    assert rc == 2 and str(p) in err and "must hold a JSON object, found list" in err


def test_no_model_type_and_no_architectures_is_exit_2(pcgh, db, tmp_path):
    cfg = load_config("Qwen__Qwen3-0.6B.json")
    del cfg["model_type"], cfg["architectures"]
    p = _write(tmp_path, "config.json", json.dumps(cfg))
    rc, _, err = pcgh("request", p, "--db", db)
    assert rc == 2 and str(p) in err and "neither model_type nor architectures" in err


def test_wrongly_typed_field_is_exit_2(pcgh, db, tmp_path):
    cfg = load_config("Qwen__Qwen3-0.6B.json") | {"hidden_size": "1024"}
    rc, _, err = pcgh("request", _write(tmp_path, "config.json", json.dumps(cfg)), "--db", db)
    assert rc == 2 and "field hidden_size must be an integer" in err


def test_unknown_architecture_is_still_analyzed(request_json, tmp_path):
    cfg = load_config("Qwen__Qwen3-30B-A3B.json") | {"model_type": "frobnicator", "architectures": ["FrobnicatorForCausalLM"],
                                                     "auto_map": {"AutoConfig": "configuration_frob.FrobConfig"}}
    r = request_json(_write(tmp_path, "config.json", json.dumps(cfg)))
    assert r["architecture"] == "FrobnicatorForCausalLM" and r["supported"] is False
    assert "'frobnicator'" in r["reason"] and "FrobnicatorForCausalLM is not supported" in r["reason"]
    assert r["features"] == ["moe"] and abs(r["params"] / 30.5e9 - 1) < 0.03  # analyzed from the raw JSON
    assert not r["verdicts"]["model"]["ok"]


def test_known_model_type_with_unknown_architecture(request_json, tmp_path):
    cfg = load_config("Qwen__Qwen3-8B.json") | {"architectures": ["Qwen3ForSomethingElse"]}
    r = request_json(_write(tmp_path, "config.json", json.dumps(cfg)))
    assert r["supported"] is False and "Qwen3ForSomethingElse is not supported" in r["reason"]


def test_architectures_without_model_type_is_analyzed(request_json, tmp_path):
    cfg = load_config("Qwen__Qwen3-8B.json")
    del cfg["model_type"]
    r = request_json(_write(tmp_path, "config.json", json.dumps(cfg)))
    assert r["architecture"] == "Qwen3ForCausalLM" and r["supported"] is False and "no model_type" in r["reason"]


def test_model_type_without_architectures_uses_transformers_default(request_json, tmp_path):
    cfg = load_config("Qwen__Qwen3-8B.json")
    del cfg["architectures"]
    r = request_json(_write(tmp_path, "config.json", json.dumps(cfg)))
    assert r["architecture"] == "Qwen3ForCausalLM" and r["supported"] is True


@pytest.mark.parametrize("args, message", [
    (["--revision", "main"], "--revision 'main' applies to hub ids only"),
    (["--quant", "fp9"], "--quant 'fp9' is not a quantization scheme"),
    (["--tp", "0"], "expected a positive integer"),
    (["--submit", "ftp://example.com"], "is not an http(s) URL"),
])
def test_bad_flags_are_exit_2(pcgh, db, args, message):
    rc, _, err = pcgh("request", REPO_CONFIGS / "Qwen__Qwen3-0.6B.json", "--db", db, *args)
    assert rc == 2 and message in err


def test_analysis_does_not_change_its_input():
    cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128,
           "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "vision_config": {"depth": 1, "hidden_size": 32}}
    before = json.dumps(cfg, sort_keys=True)
    r = analyze(cfg)
    assert json.dumps(cfg, sort_keys=True) == before
    assert r["features"] == ["vlm", "rope_scaling"]
