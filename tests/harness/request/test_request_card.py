"""`--write-card`: the card and its config land in the models folder and read back through load_cards()."""

from __future__ import annotations

import json

import yaml

from harness.cards import find_card, load_cards
from harness.cell import CellSpec
from harness.matrix.expand import Cell
from harness.matrix.precheck import precheck
from harness.request.card_writer import card_id_for, config_file_for, hub_id_for_local
from harness.store import Store
from pcg_core.capabilities import capabilities
from request_helpers import REPO_CONFIGS, cache_config, load_config

COMMIT = "c" * 40


def test_card_ids_and_file_names():
    assert card_id_for("Qwen/Qwen3-0.6B") == "qwen3-0.6b"
    assert card_id_for("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b-instruct"
    assert config_file_for("Qwen/Qwen3-0.6B") == "Qwen__Qwen3-0.6B.json"
    assert hub_id_for_local(REPO_CONFIGS / "openai__gpt-oss-120b.json", {}) == "openai/gpt-oss-120b"
    assert hub_id_for_local(REPO_CONFIGS.parent / "config.json", {"_name_or_path": "org/name"}) == "org/name"
    assert hub_id_for_local(REPO_CONFIGS.parent / "config.json", {"_name_or_path": "/local/dir"}) is None


def test_write_card_round_trip(request_json, offline, models_dir, db):
    cfg = load_config("deepseek-ai__DeepSeek-V3.json")
    cache_config(offline, "pcg-test/DeepSeek-Mini", cfg, COMMIT)
    before = set(load_cards(models_dir))
    r = request_json("pcg-test/DeepSeek-Mini", "--write-card", "--models-dir", models_dir)
    assert r["card"]["id"] == r["card_id"] == "deepseek-mini"
    card_path = models_dir / "deepseek-mini.yaml"
    assert r["card"]["path"] == str(card_path)
    assert json.loads((models_dir / "configs" / "pcg-test__DeepSeek-Mini.json").read_text()) == cfg
    cards = load_cards(models_dir)
    assert set(cards) == before | {"deepseek-mini"}
    card = cards["deepseek-mini"]
    assert card.hub_id == "pcg-test/DeepSeek-Mini" and card.architecture == "DeepseekV3ForCausalLM"
    assert card.features == ["moe", "mla", "rope_scaling", "fp8"]  # the model cards' convention: features + quant
    assert card.variants == ["full", "trim", "tiny"] and card.config == cfg
    data = yaml.safe_load(card_path.read_text())
    assert data["config"] == "configs/pcg-test__DeepSeek-Mini.json"
    with Store(db) as store:
        assert store.request(r["request_id"]).card_id == "deepseek-mini"
    # The checkout's own models folder is untouched.
    assert "deepseek-mini" not in load_cards()


def test_written_card_reads_like_a_seed_card_and_passes_the_precheck(request_json, offline, models_dir):
    cache_config(offline, "pcg-test/Qwen3-Mini", load_config("Qwen__Qwen3-0.6B.json"), COMMIT)
    request_json("pcg-test/Qwen3-Mini", "--write-card", "--models-dir", models_dir)
    text = (models_dir / "qwen3-mini.yaml").read_text()
    assert "id: qwen3-mini\nhub_id: pcg-test/Qwen3-Mini\narchitecture: Qwen3ForCausalLM\n" in text
    assert "features: []\nvariants: [full, trim, tiny]\n" in text
    axes = {"model": "qwen3-mini:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "piecewise", "compiler": "eager"}
    cell = Cell(key="k", axes=axes, spec=CellSpec(model="qwen3-mini", graph="piecewise", tiny=True), timeout_s=60)
    assert precheck(cell, capabilities(), {"qwen3-mini": find_card("qwen3-mini", models_dir)}) is None


def test_existing_card_is_not_overwritten_without_force(pcgh, db, offline, models_dir):
    cache_config(offline, "pcg-test/Qwen3-Mini", load_config("Qwen__Qwen3-0.6B.json"), COMMIT)
    args = ("request", "pcg-test/Qwen3-Mini", "--write-card", "--models-dir", models_dir, "--db", db)
    assert pcgh(*args)[0] == 0
    card = models_dir / "qwen3-mini.yaml"
    card.write_text(card.read_text() + "# hand edit\n")
    rc, _, err = pcgh(*args)
    assert rc == 2 and f"card {card} already exists; pass --force" in err
    assert card.read_text().endswith("# hand edit\n")
    with Store(db) as store:
        assert len(store.requests()) == 1  # the refused request is not recorded
    rc, _, err = pcgh(*args, "--force")
    assert rc == 0, err
    assert "# hand edit" not in card.read_text()


def test_a_hub_id_that_already_has_a_card_is_refused_without_force(pcgh, db, models_dir, tmp_path):
    # The shipped config's file name gives hub id meta-llama/Llama-3.1-8B-Instruct (card id llama-3.1-8b-instruct),
    # which card llama-3.1-8b already covers.
    name = "meta-llama__Llama-3.1-8B-Instruct.json"
    rc, _, err = pcgh("request", REPO_CONFIGS / name, "--write-card", "--models-dir", models_dir, "--db", tmp_path / "new.db")
    assert rc == 2 and "llama-3.1-8b.yaml already covers hub id meta-llama/Llama-3.1-8B-Instruct" in err
    assert not (tmp_path / "new.db").exists()  # bad input: refused before the store is made
    rc, _, err = pcgh("request", REPO_CONFIGS / name, "--write-card", "--models-dir", models_dir, "--db", db, "--force")
    assert rc == 0, err
    assert {"llama-3.1-8b", "llama-3.1-8b-instruct"} <= set(load_cards(models_dir))


def test_a_different_config_under_the_same_file_name_is_refused(pcgh, db, offline, models_dir):
    cache_config(offline, "Qwen/Qwen3-0.6B-Base", load_config("Qwen__Qwen3-0.6B.json"), COMMIT)
    (models_dir / "configs" / "Qwen__Qwen3-0.6B-Base.json").write_text("{}")
    rc, _, err = pcgh("request", "Qwen/Qwen3-0.6B-Base", "--write-card", "--models-dir", models_dir, "--db", db)
    assert rc == 2 and "already exists with a different config" in err


def test_local_config_without_a_hub_id_cannot_write_a_card(pcgh, db, tmp_path, models_dir):
    p = tmp_path / "config.json"
    p.write_text((REPO_CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    rc, _, err = pcgh("request", p, "--write-card", "--models-dir", models_dir, "--db", tmp_path / "new.db")
    assert rc == 2 and "--write-card needs the model's hub id" in err and "pass --hub-id ORG/NAME" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "new.db").exists()  # refused before the store opens


def test_a_local_config_writes_its_card_under_the_hub_id_given(request_json, pcgh, db, tmp_path, models_dir):
    p = tmp_path / "config.json"
    p.write_text((REPO_CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    r = request_json(p, "--write-card", "--models-dir", models_dir, "--hub-id", "pcg-test/Local-8B")
    assert (r["hub_id"], r["card_id"]) == ("pcg-test/Local-8B", "local-8b")
    card = find_card("local-8b", models_dir)
    assert card.hub_id == "pcg-test/Local-8B" and card.config == load_config("Qwen__Qwen3-8B.json")
    for bad, words in ((["--hub-id", "not a hub id"], "is not a hub id"), (["--hub-id", "Qwen/Qwen3-8B-Base"], "is another model")):
        model = p if "not a hub id" in bad else "Qwen/Qwen3-8B"
        rc, _, err = pcgh("request", model, "--db", db, *bad)
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_missing_models_dir_is_exit_2(pcgh, db, offline, tmp_path):
    cache_config(offline, "pcg-test/Qwen3-Mini", load_config("Qwen__Qwen3-0.6B.json"), COMMIT)
    rc, _, err = pcgh("request", "pcg-test/Qwen3-Mini", "--write-card", "--models-dir", tmp_path / "nope", "--db", db)
    assert rc == 2 and "does not exist" in err
