"""pcg_core/quant/files.py: which .safetensors files are a checkpoint (the index's shards, else model.safetensors,
else every one), and the files checked against each other (a tensor in two files, an index that disagrees with its
shards). A stray file beside the model's (Mistral's consolidated.safetensors) is never read, by the quantized
loader nor by the 16-bit one; each broken layout is an error naming the index and the file."""

from __future__ import annotations

import json

import pytest
import torch
from pcg_helpers import config_path, tiny_model
from safetensors.torch import load_file, save_file

from pcg_core import load_model
from pcg_core.errors import UnsupportedModel
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import SCHEMES, QuantLinear, write_checkpoint
from pcg_core.quant.formats.files import INDEX, CheckpointTensors, safetensors_files



@pytest.fixture(scope="module")
def qwen3():
    data = shrink_config(read_config_file(config_path("qwen3")), tiny=True, layers=2)
    return synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True), data


def _sharded(model, data, path, shards=3):
    write_checkpoint(model, data, path, "compressed-tensors", SCHEMES["fp8_per_token"], shards=shards)
    return json.loads((path / INDEX).read_text())["weight_map"]


def _stray(path, weight_map):
    """A file as Mistral repositories ship beside the shards: the same weights under the original format's names."""
    some = sorted(weight_map)[:5]
    tensors = {}
    for key in some:
        shard = load_file(path / weight_map[key])
        tensors[f"consolidated.{key}"] = shard[key]
    tensors["layers.0.attention.wq.weight"] = torch.randn(64, 64)
    save_file(tensors, path / "consolidated.safetensors")


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# --- the resolution ----------------------------------------------------------------------------------------------


def test_a_stray_file_beside_indexed_shards_is_not_read(qwen3, tmp_path):
    model, data = qwen3
    weight_map = _sharded(model, data, tmp_path)
    clean = _state(load_model(str(tmp_path), weights="real").model)
    _stray(tmp_path, weight_map)
    assert [f.name for f in safetensors_files(tmp_path)] == sorted(set(weight_map.values()))
    lm = load_model(str(tmp_path), weights="real")
    assert sum(isinstance(m, QuantLinear) for m in lm.model.modules()) == 14
    got = _state(lm.model)
    assert got.keys() == clean.keys() and all(torch.equal(got[k], clean[k]) for k in clean)
    # The check that can fail: without the index the same folder is every *.safetensors, the stray file included.
    (tmp_path / INDEX).unlink()
    with pytest.raises(UnsupportedModel, match="tensors the model does not use"):
        load_model(str(tmp_path), weights="real")


def test_model_safetensors_is_read_alone(qwen3, tmp_path):
    model, data = qwen3
    write_checkpoint(model, data, tmp_path, "compressed-tensors", SCHEMES["fp8_per_token"])
    save_file({"extra.weight": torch.zeros(2)}, tmp_path / "consolidated.safetensors")
    assert safetensors_files(tmp_path) == [tmp_path / "model.safetensors"]
    assert sum(isinstance(m, QuantLinear) for m in load_model(str(tmp_path), weights="real").model.modules()) == 14


def test_without_index_or_model_safetensors_every_file_is_read(tmp_path):
    save_file({"a": torch.zeros(2)}, tmp_path / "part-b.safetensors")
    save_file({"b": torch.ones(3)}, tmp_path / "part-a.safetensors")
    t = CheckpointTensors(tmp_path)
    assert [f.name for f in t.files] == ["part-a.safetensors", "part-b.safetensors"] and sorted(t.keys()) == ["a", "b"]
    save_file({"a": torch.ones(2)}, tmp_path / "part-c.safetensors")  # the same tensor twice: which is the model's?
    with pytest.raises(UnsupportedModel, match=r"a is in both part-b\.safetensors and part-c\.safetensors"):
        CheckpointTensors(tmp_path)
    assert safetensors_files(tmp_path / "nothing-here") == []


def _index(path, weight_map, **extra):
    (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map} | extra))


def test_an_index_naming_a_missing_shard_is_an_error_naming_both(tmp_path):
    save_file({"a": torch.zeros(2)}, tmp_path / "model-00001-of-00002.safetensors")
    _index(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    with pytest.raises(UnsupportedModel, match=rf"{INDEX}: names shard model-00002-of-00002\.safetensors, which is not "
                                               "in .*download the missing shards"):
        CheckpointTensors(tmp_path)


@pytest.mark.parametrize("text, match", [
    ("{not json", "unreadable"),
    (json.dumps({"metadata": {}}), "has no weight_map"),
    (json.dumps({"weight_map": {}}), "has no weight_map"),
    (json.dumps([1, 2]), "has no weight_map"),
    (json.dumps({"weight_map": {"a": "../outside.safetensors"}}), r"weight_map puts a in '\.\./outside\.safetensors', not a file name"),
    (json.dumps({"weight_map": {"a": "/abs/model.safetensors"}}), "weight_map puts a in '/abs/model.safetensors', not a file name inside"),
])
def test_a_broken_index_is_an_error_naming_it(tmp_path, text, match):
    save_file({"a": torch.zeros(2)}, tmp_path / "model.safetensors")
    (tmp_path / INDEX).write_text(text)
    with pytest.raises(UnsupportedModel, match=rf"{INDEX}: {match}"):
        CheckpointTensors(tmp_path)


def test_an_index_that_disagrees_with_its_shards_is_an_error(tmp_path):
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({"a": torch.zeros(2), "b": torch.zeros(2)}, tmp_path / one)
    save_file({"c": torch.zeros(2)}, tmp_path / two)
    _index(tmp_path, {"a": one, "b": one, "c": two})
    assert sorted(CheckpointTensors(tmp_path).keys()) == ["a", "b", "c"]  # the control: the same files, agreeing
    _index(tmp_path, {"a": one, "b": two, "c": two})  # b lives in shard one
    with pytest.raises(UnsupportedModel, match=rf"maps b to {two}, but it is in {one}"):
        CheckpointTensors(tmp_path)
    _index(tmp_path, {"a": one, "b": one, "c": two, "d": two})  # d lives nowhere
    with pytest.raises(UnsupportedModel, match=rf"maps d to {two}, but no shard holds it"):
        CheckpointTensors(tmp_path)
    _index(tmp_path, {"a": one, "c": two})  # b is in a shard but not in the map
    with pytest.raises(UnsupportedModel, match=rf"does not name b, which {one} holds"):
        CheckpointTensors(tmp_path)


def test_an_index_beside_a_model_safetensors_it_does_not_name_is_refused(tmp_path):
    save_file({"a": torch.zeros(2)}, tmp_path / "model-00001-of-00001.safetensors")
    save_file({"a": torch.zeros(2)}, tmp_path / "model.safetensors")
    _index(tmp_path, {"a": "model-00001-of-00001.safetensors"})
    with pytest.raises(UnsupportedModel, match="holds both model.safetensors and .*remove the stale one"):
        CheckpointTensors(tmp_path)
    _index(tmp_path, {"a": "model.safetensors"})  # an index of the one file (some tools write it): consistent
    assert CheckpointTensors(tmp_path).files == [tmp_path / "model.safetensors"]


# --- the 16-bit loader (transformers reads the files; ours are checked first) ------------------------------------


def test_16_bit_shards_with_a_stray_file_load_and_missing_ones_are_named(tmp_path):
    src = tiny_model("llama", layers=2)
    src.model.save_pretrained(tmp_path, max_shard_size="100KB")
    weight_map = json.loads((tmp_path / INDEX).read_text())["weight_map"]
    assert len(set(weight_map.values())) > 1
    _stray(tmp_path, weight_map)
    lm = load_model(str(tmp_path), weights="real")
    ref, got = src.model.state_dict(), lm.model.state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    last = sorted(set(weight_map.values()))[-1]
    (tmp_path / last).unlink()
    with pytest.raises(UnsupportedModel, match=rf"{INDEX}: names shard {last}, which is not in"):
        load_model(str(tmp_path), weights="real")


def test_16_bit_files_transformers_would_not_find_are_refused_by_name(tmp_path):
    src = tiny_model("llama", layers=2)
    src.model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "weights.safetensors")
    with pytest.raises(UnsupportedModel, match="holds weights.safetensors but neither model.safetensors nor"):
        load_model(str(tmp_path), weights="real")


def test_the_hub_download_asks_for_the_index_shards_only(tmp_path, monkeypatch):
    import huggingface_hub

    from pcg_core.model import loader

    asked = []
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                             "b": "model-00002-of-00002.safetensors"}}))

    def snapshot(hub_id, revision=None, allow_patterns=None, local_files_only=False):
        asked.append(list(allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.setattr(loader, "hub_reachable", lambda: True)
    assert loader.fetch_hub_weights("org/model") == str(tmp_path)
    assert asked == [["*.json"], ["*.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]]
    (tmp_path / INDEX).unlink()
    asked.clear()
    loader.fetch_hub_weights("org/model")
    assert asked[-1] == ["*.json", "*.safetensors"]
    (tmp_path / "config.json").write_text(json.dumps({"transformers_weights": "weights-fp8.safetensors"}))
    loader.fetch_hub_weights("org/model")
    assert asked[-1] == ["*.json", "weights-fp8.safetensors"]


# --- config.json's transformers_weights: the file transformers reads instead ------------------------------------


def _name_weights(path, named):
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"transformers_weights": named}))


def test_transformers_weights_names_the_file_for_both_loaders(qwen3, tmp_path):
    model, data = qwen3
    write_checkpoint(model, data, tmp_path / "q", "compressed-tensors", SCHEMES["fp8_per_token"])
    (tmp_path / "q" / "model.safetensors").rename(tmp_path / "q" / "weights-fp8.safetensors")
    save_file({"extra.weight": torch.zeros(2)}, tmp_path / "q" / "consolidated.safetensors")
    _name_weights(tmp_path / "q", "weights-fp8.safetensors")
    assert sum(isinstance(m, QuantLinear) for m in load_model(str(tmp_path / "q"), weights="real").model.modules()) == 14
    src = tiny_model("llama", layers=2)
    src.model.save_pretrained(tmp_path / "f")
    (tmp_path / "f" / "model.safetensors").rename(tmp_path / "f" / "weights.safetensors")
    with pytest.raises(UnsupportedModel, match="holds weights.safetensors but neither"):  # the control: unnamed
        load_model(str(tmp_path / "f"), weights="real")
    _name_weights(tmp_path / "f", "weights.safetensors")
    got, ref = load_model(str(tmp_path / "f"), weights="real").model.state_dict(), src.model.state_dict()
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.mark.parametrize("named, match", [
    ("../elsewhere.safetensors", "is not a .safetensors file or a .safetensors.index.json inside the folder"),
    ("model.bin", "is not a .safetensors file"),
    ("gone.safetensors", "transformers_weights names gone.safetensors, which is not in"),
])
def test_a_bad_transformers_weights_is_an_error_naming_it(tmp_path, named, match):
    save_file({"a": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedModel, match=match):
        CheckpointTensors(tmp_path, named)


def test_transformers_weights_may_name_an_index(tmp_path):
    save_file({"a": torch.zeros(2)}, tmp_path / "w-1.safetensors")
    save_file({"b": torch.zeros(2)}, tmp_path / "w-2.safetensors")
    save_file({"a": torch.ones(2)}, tmp_path / "model.safetensors")  # what transformers would read without the name
    (tmp_path / "w.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "w-1.safetensors",
                                                                                 "b": "w-2.safetensors"}}))
    t = CheckpointTensors(tmp_path, "w.safetensors.index.json")
    assert [f.name for f in t.files] == ["w-1.safetensors", "w-2.safetensors"] and torch.equal(t.get("a"), torch.zeros(2))
    (tmp_path / "w.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "w-2.safetensors",
                                                                                 "b": "w-2.safetensors"}}))
    with pytest.raises(UnsupportedModel, match=r"w\.safetensors\.index\.json: maps a to w-2\.safetensors, but no shard holds it"):
        CheckpointTensors(tmp_path, "w.safetensors.index.json")
