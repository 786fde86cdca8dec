"""Matrix files: validation with file:line errors, deterministic expansion, rules, overrides, pre-check."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.matrix import expand, load_matrix, precheck
from harness.outcome import cell_key
from pcg_core.capabilities import capabilities
from pcg_core.errors import ConfigError

CONFIGS = Path(__file__).parents[3] / "harness" / "configs"


@pytest.mark.parametrize("name", ["smoke", "nightly", "full"])
def test_shipped_matrices_load_and_expand_deterministically(name):
    m = load_matrix(CONFIGS / f"{name}.yaml")
    a, b = expand(m), expand(load_matrix(CONFIGS / f"{name}.yaml"))
    assert [c.key for c in a] == [c.key for c in b] and len(a) == len({c.key for c in a}) > 0


def test_cell_key_is_stable_and_readable():
    axes = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "full", "compiler": "eager"}
    assert cell_key(axes) == "model=qwen3-0.6b:tiny|quant=none|attention=sdpa|parallel=tp1|graph=full|compiler=eager"


def _write(tmp_path, text) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("name: x\naxes:\n  model: [qwen3-0.6b:tiny]\n  grph: [full]\n", 4, ["axes.grph", "unknown key 'grph'; did you mean 'graph'?"]),
        ("name: x\naxes:\n  model:\n    - qwen3-0.6b:tiny\n    - qwen3-0.6b:huge\n", 3, ["axes.model", "CARD:VARIANT"]),
        ("name: x\ndefaults:\n  max_tokens: -3\naxes:\n  model: [qwen3-0.6b:tiny]\n", 3, ["defaults.max_tokens", "greater than 0"]),
        ("name: x\ndefaults:\n  device: tpu\naxes:\n  model: [qwen3-0.6b:tiny]\n", 3, ["defaults.device", "'cpu' or 'cuda'"]),
        ("name: x\naxes:\n  model: [qwen3-0.6b:tiny]\nexclude:\n  - {grap: full}\n", 5, ["exclude.0", "unknown axis", "did you mean 'graph'?"]),
        ("axes:\n  model: [qwen3-0.6b:tiny]\n", None, ["field name", "Field required"]),
    ],
)
def test_malformed_matrix_names_file_line_and_field(tmp_path, text, line, words):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_matrix(path)
    msg = str(e.value)
    assert str(path) in msg
    if line is not None:
        assert f"{path}:{line}:" in msg
    for w in words:
        assert w in msg, msg


def test_not_yaml_names_the_line(tmp_path):
    path = _write(tmp_path, "name: x\naxes: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: not valid YAML"):
        load_matrix(path)


def test_include_exclude_overrides_and_tiers(tmp_path):
    path = _write(tmp_path, """
name: rules
defaults: {max_tokens: 64, tolerances: {logprob: 0.001}}
axes:
  model: [qwen3-0.6b:tiny, mixtral-8x7b:tiny, qwen3-8b:trim:2]
  graph: [piecewise, breakable, full]
include:
  - {model: "qwen3-*"}
  - {model: "mixtral-*", graph: piecewise}
exclude:
  - {model: "*:trim:*", graph: full}
overrides:
  "mixtral-*": {tolerances: {logprob: 0.5}, max_tokens: 32}
  "qwen3-8b:*": {axes: {graph: [breakable, full]}}
tiers:
  fast: {graph: piecewise}
""")
    m = load_matrix(path)
    keys = {(c.axes["model"], c.axes["graph"]): c for c in expand(m)}
    assert set(keys) == {("qwen3-0.6b:tiny", "piecewise"), ("qwen3-0.6b:tiny", "breakable"), ("qwen3-0.6b:tiny", "full"),
                         ("mixtral-8x7b:tiny", "piecewise"), ("qwen3-8b:trim:2", "breakable")}
    mix = keys[("mixtral-8x7b:tiny", "piecewise")].spec
    assert mix.logprob_tol == 0.5 and mix.max_tokens == 32 and mix.tiny
    q = keys[("qwen3-0.6b:tiny", "full")].spec
    assert q.logprob_tol == 0.001 and q.max_tokens == 64
    trim = keys[("qwen3-8b:trim:2", "breakable")].spec
    assert trim.layers == 2 and not trim.tiny and trim.weights == "synthetic"
    assert {c.axes["graph"] for c in expand(m, tier="fast")} == {"piecewise"}
    assert {c.axes["model"] for c in expand(m, filters=[{"model": "mixtral*"}])} == {"mixtral-8x7b:tiny"}
    with pytest.raises(ConfigError, match="tier 'slow' is not in matrix"):
        expand(m, tier="slow")


def _cell(tmp_path, model="qwen3-0.6b:tiny", graph="piecewise", quant="none", parallel="tp1", device="cpu", attention="sdpa",
          kv_cache="auto"):
    path = _write(tmp_path, f"name: p\ndefaults: {{device: {device}}}\naxes:\n  model: ['{model}']\n  graph: [{graph}]\n"
                            f"  quant: [{quant}]\n  parallel: [{parallel}]\n  attention: [{attention}]\n"
                            f"  kv_cache: [{kv_cache}]\n")
    return expand(load_matrix(path))[0]


def test_precheck_reads_the_runtime_table(tmp_path, monkeypatch):
    from pcg_core.model import architectures

    monkeypatch.delitem(architectures.SUPPORTED_ARCHITECTURES, "Qwen3NextForCausalLM")  # an architecture it lacks
    caps = capabilities()
    caps["cuda_devices"] = 0
    assert precheck(_cell(tmp_path), caps, {}) is None
    assert "Qwen3NextForCausalLM" in precheck(_cell(tmp_path, model="qwen3-next-80b-a3b:tiny"), caps, {})
    assert "quantization 'fp8'" in precheck(_cell(tmp_path, quant="fp8"), caps, {})
    assert "parallel mode 'tp16'" in precheck(_cell(tmp_path, parallel="tp16"), caps, {})
    assert precheck(_cell(tmp_path, parallel="tp2"), caps, {}) is None  # two gloo ranks on a CPU
    assert "0 visible" in precheck(_cell(tmp_path, device="cuda"), caps, {})
    caps["attention_backends"]["sdpa"] = {"capturable": False, "why_not_capturable": "host sync in the kernel"}
    assert "host sync in the kernel" in precheck(_cell(tmp_path, graph="full"), caps, {})
    assert precheck(_cell(tmp_path, graph="piecewise"), caps, {}) is None  # runs attention between graphs
    # the rule is the backend's own declaration, not a name the pre-check knows
    caps["capture_backends"]["piecewise"] = {"requires_capturable_attention": True}
    assert "needs a capturable attention backend" in precheck(_cell(tmp_path, graph="piecewise"), caps, {})


def test_precheck_of_real_weights_needs_a_checkpoint_in_the_scheme(tmp_path):
    """A real-weights cell loads the checkpoint its card declares for the scheme (harness/models/*.yaml
    `quantized:`); without one it is unsupported, naming the card and what it declares."""
    caps = capabilities()
    caps["cuda_devices"] = 1
    assert precheck(_cell(tmp_path, model="qwen3-8b:full", quant="fp8_block", device="cuda"), caps, {}) is None
    why = precheck(_cell(tmp_path, model="qwen3-8b:full", quant="int8_w8a8", device="cuda"), caps, {})
    assert "card qwen3-8b declares no int8_w8a8 checkpoint" in why and "Qwen/Qwen3-8B-FP8" in why
    assert precheck(_cell(tmp_path, model="qwen3-8b:trim:2", quant="int8_w8a8", device="cuda"), caps, {}) is None


def test_precheck_marks_attention_backends_a_device_or_a_model_rules_out(tmp_path):
    caps = capabilities()
    assert precheck(_cell(tmp_path, attention="flex"), caps, {}) is None
    reason = precheck(_cell(tmp_path, attention="varlen"), caps, {})
    assert reason and "'varlen' cannot run on cpu" in reason and "CUDA" in reason
    # a feature the model card exercises and the backend declares it lacks (read from the table, not named here)
    from pcg_core.capabilities import attention_unsupported_reason

    caps["attention_backends"]["flex"]["features"]["sliding_window"] = "no windows in this build"
    reason = attention_unsupported_reason("flex", "cuda", ["moe", "sliding_window"], caps["attention_backends"])
    assert reason == "attention backend 'flex' cannot run sliding_window (no windows in this build); sdpa can"
    assert attention_unsupported_reason("flex", "cuda", ["moe"], caps["attention_backends"]) is None
    assert "not in the runtime" in attention_unsupported_reason("triton", "cpu", [], caps["attention_backends"])


def test_matrix_grows_with_the_runtime(tmp_path, monkeypatch):
    """Teach the runtime an architecture and the same matrix launches the cell — the harness is not edited."""
    from pcg_core.model import architectures

    cell = _cell(tmp_path, model="qwen3-next-80b-a3b:tiny")
    known = architectures.SUPPORTED_ARCHITECTURES["Qwen3NextForCausalLM"]
    monkeypatch.delitem(architectures.SUPPORTED_ARCHITECTURES, "Qwen3NextForCausalLM")  # as before the runtime ran it
    assert "Qwen3NextForCausalLM" in precheck(cell, capabilities(), {})
    monkeypatch.setitem(architectures.SUPPORTED_ARCHITECTURES, "Qwen3NextForCausalLM", known)
    assert precheck(cell, capabilities(), {}) is None


def test_full_capture_of_linear_attention_is_unsupported_with_the_split_ops_reason(tmp_path, monkeypatch):
    """pcg::linear_attention is not capturable: full cannot record it, piecewise and breakable run it between graphs."""
    caps = capabilities()
    assert caps["split_ops"]["pcg::linear_attention"]["capturable"] is False
    reason = precheck(_cell(tmp_path, model="qwen3-next-80b-a3b:tiny", graph="full"), caps, {})
    assert "pcg::linear_attention" in reason and "host" in reason
    for graph in ("piecewise", "breakable"):
        assert precheck(_cell(tmp_path, model="qwen3-next-80b-a3b:tiny", graph=graph), caps, {}) is None
    monkeypatch.setitem(caps["split_ops"]["pcg::linear_attention"], "capturable", True)  # the table decides
    assert precheck(_cell(tmp_path, model="qwen3-next-80b-a3b:tiny", graph="full"), caps, {}) is None


def _many_rules_matrix(tmp_path: Path, n_rules: int = 200) -> Path:
    models = [f"{c}:trim:{i}" for c in ("qwen3-0.6b", "qwen3-8b", "qwen2.5-0.5b", "llama-3.1-8b") for i in range(1, 21)]
    quants = ["none", "fp8", "int8", "awq", "gptq"]
    lines = ["name: many", "axes:", f"  model: [{', '.join(models)}]", f"  quant: [{', '.join(quants)}]",
             "  parallel: [tp1, tp2, tp4, tp8, ep8]", "  graph: [piecewise, breakable, full]", "exclude:"]
    lines += [f"  - {{model: '{models[i % 80]}', quant: {quants[i % 5]}, graph: full}}" for i in range(n_rules)]
    patterns = (models + ["?" + m[1:] for m in models] + ["*" + m[2:] for m in models])[:n_rules]
    lines += ["overrides:"] + [f"  '{p}': {{timeout_s: {i + 1}}}" for i, p in enumerate(patterns)]
    path = tmp_path / "many.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_expansion_does_not_match_every_cell_against_every_rule(tmp_path):
    """6,000 cells × 200 excludes × 200 overrides: fnmatch per cell and rule took seconds; masks take milliseconds."""
    m = load_matrix(_many_rules_matrix(tmp_path))
    start = time.perf_counter()
    cells = expand(m)
    assert time.perf_counter() - start < 2.0
    assert len(cells) == 80 * 5 * 5 * 3 - 80 * 5  # 80 distinct (model, quant) excludes on graph full, × 5 parallel
    by_key = {c.key: c for c in cells}
    first = by_key[cell_key({"model": "qwen3-0.6b:trim:1", "quant": "fp8", "attention": "sdpa", "parallel": "tp1",
                             "graph": "full", "compiler": "eager"})]
    assert first.timeout_s == 161  # the last matching override wins: '*en3-0.6b:trim:1' is pattern 161


def test_more_rules_than_the_limit_are_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"field exclude: List should have at most 200 items"):
        load_matrix(_many_rules_matrix(tmp_path, n_rules=201))


def test_precheck_reads_which_attention_backends_read_an_fp8_kv_cache(tmp_path):
    caps = capabilities()
    cell = _cell(tmp_path, kv_cache="fp8_e4m3", attention="flex")
    assert cell.spec.kv_cache == "fp8_e4m3" and cell.key.endswith("|kv_cache=fp8_e4m3")
    assert precheck(cell, caps, {}) is None
    caps["attention_backends"]["flex"]["kv_cache"] = {"auto": None, "fp8_e4m3": "it reads the cache tensors itself"}
    assert precheck(cell, caps, {}) == "it reads the cache tensors itself"
    assert precheck(_cell(tmp_path, attention="flex"), caps, {}) is None  # the 16-bit cache still runs
    assert "kv_cache" not in _cell(tmp_path).key  # auto cells keep the keys they had before the axis
