"""Names and numbers in a matrix are checked when it loads: a typo is an error with a suggestion, not a quietly
`unsupported` cell (exit 0); a known-but-unimplemented name still loads and is unsupported with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.matrix import expand, load_matrix, precheck, select
from harness.matrix.names import MAX_CELLS
from harness.matrix.schema import MAX_NEW_TOKENS
from harness.request.quantization import QUANT_WORDS
from pcg_core.capabilities import PARALLEL, QUANTIZATION, capabilities
from pcg_core.errors import ConfigError
from pcg_core.known import KNOWN_QUANTIZATION, MAX_TOKENS, PLANNED_ATTENTION, parse_parallel
from pcg_core.registry import ATTENTION_BACKENDS

CONFIGS = Path(__file__).parents[3] / "harness" / "configs"


def _matrix(tmp_path: Path, body: str, model: str = "qwen3-0.6b:tiny") -> Path:
    p = tmp_path / "m.yaml"
    p.write_text(f"name: t\naxes:\n  model: ['{model}']\n{body}")
    return p


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        load_matrix(path)
    return str(e.value)


@pytest.mark.parametrize("axis, value, words", [
    ("graph", "fulll", ["unknown capture backend 'fulll'", "did you mean 'full'"]),
    ("graph", "disabled", ["unknown capture backend 'disabled'", "known: piecewise"]),
    ("attention", "sdpaa", ["unknown attention backend 'sdpaa'", "did you mean 'sdpa'"]),
    ("quant", "fp9", ["unknown quantization scheme 'fp9'", "did you mean", "'fp8'"]),
    ("quant", "nvfp", ["did you mean", "'nvfp4'"]),
    ("compiler", "inducter", ["unknown compiler 'inducter'", "did you mean 'inductor'"]),
    ("parallel", "tp2ep8", ["parallel mode 'tp2ep8'", "did you mean 'tp2-ep8'"]),
    ("parallel", "ep8-tp2", ["write it tp2-ep8"]),
    ("parallel", "tp0", ["parallel mode 'tp0'"]),
    ("parallel", "tp4096", ["over 1024"]),
    ("kv_cache", "fp8_e4m4", ["unknown KV cache dtype 'fp8_e4m4'", "did you mean 'fp8_e4m3'", "known: auto, fp8_e4m3"]),
])
def test_unknown_axis_value_is_an_error_with_file_line_and_suggestion(tmp_path, axis, value, words):
    path = _matrix(tmp_path, f"  {axis}: [piecewise, '{value}']\n" if axis == "graph" else f"  {axis}: ['{value}']\n")
    msg = _error(path)
    assert f"{path}:4: field axes.{axis}." in msg, msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("model, words", [
    ("qwen3-8:tiny", ["no model card 'qwen3-8'", "did you mean 'qwen3-8b'"]),
    ("no-such-model:tiny", ["no model card 'no-such-model'", "pcgh models"]),
    ("qwen3-0.6b:trim:99", ["qwen3-0.6b has 28 decoder layers"]),
])
def test_unknown_model_card_or_depth_is_an_error(tmp_path, model, words):
    path = _matrix(tmp_path, "", model=model)
    msg = _error(path)
    assert f"{path}:3: field axes.model.0" in msg
    for w in words:
        assert w in msg, msg


def test_a_variant_the_card_does_not_offer_is_an_error(tmp_path):
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "m.yaml").write_text("id: m\nhub_id: org/m\narchitecture: Qwen3ForCausalLM\nconfig: {model_type: qwen3}\n"
                                  "variants: [full]\n")
    path = _matrix(tmp_path, "", model="m:tiny")
    with pytest.raises(ConfigError, match="card m offers variants full, not tiny"):
        load_matrix(path, cards_dir=cards)


@pytest.mark.parametrize("body, field, words", [
    ("defaults: {max_tokens: 100000000}\n", "defaults.max_tokens", [f"less than or equal to {MAX_TOKENS}"]),
    ("overrides: {'q*': {max_tokens: 100000000}}\n", "overrides.q*.max_tokens", ["less than or equal"]),
    (f"defaults: {{max_new_tokens: {MAX_NEW_TOKENS + 1}}}\n", "defaults.max_new_tokens", ["less than or equal"]),
    ("defaults: {timeout_s: 100000000}\n", "defaults.timeout_s", ["less than or equal"]),
    ("defaults: {top_k: 50000}\n", "defaults.top_k", ["less than or equal"]),
    ("defaults: {seed: -1}\n", "defaults.seed", ["greater than or equal to 0"]),
    ("defaults: {tolerances: {logprob: .inf}}\n", "defaults.tolerances.logprob", ["finite"]),
])
def test_numbers_out_of_range_are_errors(tmp_path, body, field, words):
    path = _matrix(tmp_path, body)
    msg = _error(path)
    assert f"{path}:4: field {field}" in msg, msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("body, field, words", [
    ("  graph: [piecewise]\nexclude:\n  - {graph: ful}\n", "exclude.0.graph", ["matches none", "graph values (piecewise)"]),
    ("  graph: [piecewise, full]\ninclude:\n  - {graph: 'ful'}\n", "include.0.graph", ["did you mean 'full'"]),
    ("tiers:\n  quick: {quant: nnone}\n", "tiers.quick.quant", ["matches none", "did you mean 'none'"]),
    ("overrides:\n  'qwen3-8b:*': {timeout_s: 5}\n", "overrides.qwen3-8b:*.model", ["matches none"]),
    ("overrides:\n  'qwen3-*': {axes: {graph: [fulll]}}\n", "overrides.qwen3-*.axes.graph.0", ["did you mean 'full'"]),
])
def test_dead_rules_and_unknown_limits_are_errors(tmp_path, body, field, words):
    msg = _error(_matrix(tmp_path, body))
    assert f"field {field}" in msg, msg
    for w in words:
        assert w in msg, msg


def test_an_axis_product_too_large_to_expand_is_an_error(tmp_path):
    n = 100  # 28 models × 7 quant × 100 parallel × 3 graph × 2 compiler = 117,600 cells
    models = ", ".join(f"qwen3-0.6b:trim:{i % 28 + 1}" for i in range(28))
    parallel = ", ".join(f"tp{i + 1}" for i in range(n))
    path = tmp_path / "m.yaml"
    path.write_text(f"name: t\naxes:\n  model: [{models}]\n  quant: [none, fp8, int8, awq, gptq, fp4, w4a8]\n"
                    f"  parallel: [{parallel}]\n  graph: [piecewise, breakable, full]\n  compiler: [eager, inductor]\n")
    assert _error(path).count(f"over the {MAX_CELLS:,}") == 1


def test_known_but_unimplemented_names_load_and_are_unsupported_cells(tmp_path):
    """The nightly's planned schemes and backends are cells, unsupported with the pre-check's reason."""
    path = _matrix(tmp_path, "  quant: [w4a8, gguf]\n  attention: [fa3]\n  parallel: [tp2-ep8]\n")
    caps = capabilities()
    for cell in expand(load_matrix(path)):
        reason = precheck(cell, caps, {})
        assert reason and ("quantization" in reason or "attention backend 'fa3'" in reason), reason


def test_backends_a_plugin_registers_are_known_when_the_matrix_loads(tmp_path, monkeypatch):
    (tmp_path / "my_attn_plugin.py").write_text(
        "from pcg_core.attention import AttentionBackend, register_attention_backend\n"
        "@register_attention_backend\nclass Mine(AttentionBackend):\n    name = 'mine'\n"
        "    def forward(self, *a, **k): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ATTENTION_BACKENDS, "_classes", dict(ATTENTION_BACKENDS._classes))  # restored after
    monkeypatch.delitem(sys.modules, "my_attn_plugin", raising=False)
    path = _matrix(tmp_path, "  attention: [mine]\n")
    assert "unknown attention backend 'mine'" in _error(path)
    monkeypatch.setenv("PCG_PLUGINS", "my_attn_plugin")
    assert load_matrix(path).axes.attention == ["mine"]  # load_matrix loads the plugins before it checks


def test_every_shipped_matrix_loads():
    for path in sorted(CONFIGS.glob("*.yaml")):
        assert expand(load_matrix(path)), path


def test_one_vocabulary_covers_what_runs_and_what_is_asked_for():
    assert set(QUANTIZATION) <= set(KNOWN_QUANTIZATION)
    assert set(QUANT_WORDS) <= set(KNOWN_QUANTIZATION)  # so `pcgh request --quant` can share the list
    assert all(parse_parallel(p) for p in PARALLEL)
    assert "sdpa" not in PLANNED_ATTENTION  # registered backends are read from the registry, not listed twice


def test_a_misspelt_axis_value_is_one_error_not_a_second_on_the_rules_naming_the_right_one(tmp_path):
    msg = _error(_matrix(tmp_path, "  graph: [piecewize, full]\ntiers:\n  quick: {graph: piecewise}\n"
                                   "exclude:\n  - {graph: full, quant: nnone}\n"))
    assert msg.count("\n  ") == 2, msg  # the typo, and the dead rule on another axis; nothing on tiers.quick
    assert "field axes.graph.0: unknown capture backend 'piecewize'; did you mean 'piecewise'?" in msg
    assert "exclude.0.quant" in msg and "tiers" not in msg and "did you mean 'piecewize'" not in msg


@pytest.mark.parametrize("body, line, field, words", [
    ("defaults: {tmeout_s: 5}\n", 4, "defaults.tmeout_s", ["unknown key 'tmeout_s'; did you mean 'timeout_s'?",
                                                         "(defaults takes: device, dtype,"]),
    ("overrides:\n  'qwen3-*': {tolerances: {logprb: 0.1}}\n", 5, "overrides.qwen3-*.tolerances.logprb",
     ["unknown key 'logprb'; did you mean 'logprob'?"]),
    ("nightly: {kepe: 3}\n", 4, "nightly.kepe", ["did you mean 'keep'?"]),
    ("tiers: {}\nincldue: []\n", 5, "incldue", ["unknown key 'incldue'; did you mean 'include'?"]),
])
def test_an_unknown_key_is_named_with_the_nearest_key(tmp_path, body, line, field, words):
    path = _matrix(tmp_path, body)
    msg = _error(path)
    assert f"{path}:{line}: field {field}: " in msg, msg
    assert "Extra inputs" not in msg
    for w in words:
        assert w in msg, msg


def test_loading_and_selecting_a_matrix_costs_no_torch(tmp_path):
    """A typo is reported before the runtime is imported (the seconds torch takes): the names come from the
    registries' own torch-free module, the cards from a torch-free reader, the pre-check imports on first use."""
    path = _matrix(tmp_path, "  graph: [piecewise, fulll]\n")
    code = ("import sys\nfrom harness.matrix import load_matrix, select\nfrom pcg_core.errors import ConfigError\n"
            f"select(load_matrix({str(CONFIGS / 'smoke.yaml')!r}), [{{'graph': 'full'}}], None, 'smoke.yaml')\n"
            f"try:\n    load_matrix({str(path)!r})\nexcept ConfigError as e:\n    assert 'fulll' in str(e)\n"
            "else:\n    raise AssertionError('no error')\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("filters, tier, words", [
    ([{"graph": "piecewize"}], None, ["--filter graph=piecewize: 'piecewize' matches none of m.yaml's graph values",
                                      "did you mean 'piecewise'?"]),
    ([{"model": "nomatch*"}], None, ["--filter model=nomatch*: 'nomatch*' matches none of m.yaml's model values "
                                     "(qwen3-0.6b:tiny, mixtral-8x7b:tiny)"]),
    ([{"model": "mixtral*"}, {"graph": "full"}], None, ["--filter model=mixtral* --filter graph=full selects no cells "
                                                         "of m.yaml", "--dry-run"]),
    ([{"graph": "full"}], "quick", ["--tier quick --filter graph=full selects no cells of m.yaml"]),
    ([], "quik", ["tier 'quik' is not in matrix 't'; did you mean 'quick'?"]),
])
def test_filters_and_tiers_that_select_nothing_are_errors(tmp_path, filters, tier, words):
    m = load_matrix(_matrix(tmp_path, "  graph: [piecewise, full]\ninclude:\n  - {model: 'qwen3-*'}\n"
                                      "  - {model: 'mixtral-*', graph: piecewise}\ntiers:\n  quick: {graph: piecewise}\n",
                            model="qwen3-0.6b:tiny', 'mixtral-8x7b:tiny"))
    with pytest.raises(ConfigError) as e:
        select(m, filters, tier, "m.yaml")
    for w in words:
        assert w in str(e.value), str(e.value)
    assert [c.axes["graph"] for c in select(m, [{"model": "mixtral*"}], "quick", "m.yaml")] == ["piecewise"]


def test_a_family_rule_selects_schemes_and_an_alias_is_its_scheme(tmp_path):
    """`family:` patterns select by what a scheme is; `fp4` (NVFP4's old name) in the axis is the nvfp4 cell."""
    path = _matrix(tmp_path, "  quant: [none, fp4, nvfp4, awq, fp8_block, w4a8]\ninclude:\n"
                             "  - {quant: none}\n  - {quant: 'family:w4a16'}\n")
    assert load_matrix(path).axes.quant == ["none", "nvfp4", "awq", "fp8_block", "w4a8"]
    cells = expand(load_matrix(path))
    assert [c.axes["quant"] for c in cells] == ["none", "nvfp4", "awq"]
    caps = capabilities()
    assert precheck(next(c for c in cells if c.axes["quant"] == "nvfp4"), caps, {}) is None  # it launches


@pytest.mark.parametrize("family, words", [("w4a61", ["w4a16"]), ("fp9", ["fp8", "fp4"])])
def test_a_family_that_selects_nothing_is_an_error_naming_the_families(tmp_path, family, words):
    path = _matrix(tmp_path, f"  quant: [none, awq, fp8_block, nvfp4]\nexclude:\n  - {{quant: 'family:{family}'}}\n")
    err = _error(path)
    assert f"'family:{family}' matches none" in err and "families: w8a8" in err
    assert all(repr(w) in err for w in words[:1]), err
