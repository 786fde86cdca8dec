"""run_cell and `pcgh cell` end to end on the CPU: statuses, the outcome's fields, exit codes, bad input, planted faults."""

import json
import random

import pytest
import torch

from harness.cards import CARDS_DIR
from harness.cell import CellSpec, run_cell
from harness.cli import main
from harness.matrix import Matrix, expand, precheck
from harness.outcome import CellOutcome, Status
from pcg_core.capabilities import capabilities
from pcg_core.engine.engine import Engine
from pcg_core.engine.inputs import InputBuffers

CONFIGS = CARDS_DIR / "configs"


@pytest.mark.parametrize("graph", ["piecewise", "breakable", "full"])
def test_cell_json_passes_on_tiny_moe(graph, capsys):
    rc = main(["cell", "--model", "qwen3-30b-a3b", "--tiny", "--graph", graph, "--device", "cpu", "--max-tokens", "64", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert out["spec"]["graph"] == graph and out["spec"]["model"] == "qwen3-30b-a3b"
    o = CellOutcome.model_validate(out)  # the JSON is the outcome type, whole
    m = o.metrics
    assert o.status == "pass" and m.judge.token_match == 1.0 and m.judge.topk_containment_ok is True
    assert m.settings.device == "cpu" and m.settings.dtype == "float32" and m.settings.max_tokens == 64 and m.settings.tiny is True
    assert m.capture.pieces == {"piecewise": 3, "breakable": 3, "full": 1}[graph]
    assert m.capture.graphs_captured == 0  # CPU: no CUDA graphs, the split/pad path still ran
    assert m.capture.eager_fallbacks >= 1  # the above-max case ran eagerly and was counted
    assert m.capture.capture_s is not None and m.capture.compile_s is not None and m.capture.graph_pool_bytes is not None
    assert m.judge.max_prompt_logprob_diff is not None and m.judge.max_output_logprob_diff is not None
    assert set(m.latency.latency_ms) == {8, 32} and all(v > 0 for v in m.latency.speedup.values())
    assert set(m.process.phase_s) == {"load", "eager", "reference", "capture", "run", "judge", "latency"}  # where the cell's time went
    assert m.process.peak_gpu_bytes is None  # a CPU cell has no device memory to report
    assert m.judge.reference.status == "pass" and m.judge.reference.positions > 0  # eager held to transformers' forward
    # each phase and the total are rounded to the millisecond: the sum may overshoot by half a millisecond per rounding
    rounding = 5e-4 * (len(m.process.phase_s) + 1)
    assert all(v >= 0 for v in m.process.phase_s.values()) and sum(m.process.phase_s.values()) <= m.process.cell_s + rounding


def test_cell_on_a_config_not_tested_elsewhere(tmp_path):
    """A config with head counts, widths and depth no other test uses (the 'configs you did not test' rule)."""
    rng = random.Random(7)
    heads = rng.choice([6, 10, 12])
    cfg = json.loads((CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    cfg.update(hidden_size=heads * 8, num_attention_heads=heads, num_key_value_heads=2, head_dim=8,
               intermediate_size=96, num_hidden_layers=3, vocab_size=1000)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run_cell(CellSpec(model=str(path), graph="piecewise", max_tokens=32, max_new_tokens=4))
    assert r.status == "pass", r.reason
    assert r.metrics.capture.pieces == 4 and r.metrics.settings.layers == 3


def test_planted_stale_input_fails_accuracy(monkeypatch):
    """A stale static input (positions not refreshed after the first forward) must be caught as fail_accuracy."""
    real_stage = Engine.stage_inputs

    def stale_stage(self, batch, num_tokens, replay):
        positions = self.inputs._dev["rows"][1]
        before = positions.clone()
        out = real_stage(self, batch, num_tokens, replay)
        if self.inputs._pcg_graph and num_tokens <= self.inputs.capacity:
            positions.copy_(before)  # the planted bug: the static positions are never refreshed
        return out

    real_init = InputBuffers.__init__

    def tagged_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._pcg_graph = tagged_init.count > 0  # the first engine built is the eager reference
        tagged_init.count += 1

    tagged_init.count = 0
    monkeypatch.setattr(Engine, "stage_inputs", stale_stage)
    monkeypatch.setattr(InputBuffers, "__init__", tagged_init)
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, graph="piecewise", max_tokens=32, max_new_tokens=4))
    assert r.status == "fail_accuracy", r
    assert "logprob diff" in r.reason or "top-k" in r.reason
    # layer 5: the eager side stages its own inputs (its own engine, its own KV cache), so the stale positions
    # show where they are first read: the rotary embedding, inside piece 0
    assert "first diverging piece 0 (up to attention 0)" in r.reason, r.reason
    assert r.metrics.judge.diverging_piece == "piece 0 (up to attention 0)" and r.metrics.judge.max_prompt_kl > 0


def test_unsupported_architecture_is_a_status_not_a_crash(capsys, tmp_path, configs):
    # an architecture the runtime lacks: Qwen3's config read as OLMo-2's (transformers has it, pcg's table does not)
    olmo = {**json.loads((configs / "Qwen__Qwen3-0.6B.json").read_text()), "architectures": ["Olmo2ForCausalLM"],
            "model_type": "olmo2"}
    (tmp_path / "config.json").write_text(json.dumps(olmo))
    rc = main(["cell", "--model", str(tmp_path / "config.json"), "--tiny", "--graph", "piecewise", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["status"] == "unsupported" and "Olmo2ForCausalLM" in out["reason"]


@pytest.mark.parametrize("inner,status", [(RuntimeError("model.safetensors: unexpected end of data"), Status.EAGER_FAIL),
                                          (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
                                           Status.OOM)])
def test_a_wrapped_load_error_is_recorded_with_what_it_wraps(inner, status, monkeypatch):
    """transformers' lazy import wraps the real error ("Could not import module 'Qwen3MoeForCausalLM'", seen on the
    H200 with 8 cells starting together): the reason carries the wrapped one too, and an out-of-memory inside is OOM."""
    def load(*args, **kwargs):
        try:
            raise inner
        except Exception as e:
            raise ModuleNotFoundError("Could not import module 'Qwen3MoeForCausalLM'") from e

    monkeypatch.setattr("harness.cell.run.load_model", load)
    out = run_cell(CellSpec(model="qwen3-0.6b", tiny=True))
    assert out.status == status
    assert "Could not import module" in out.reason and f"raised from {type(inner).__name__}: {inner}" in out.reason


def test_an_out_of_memory_handled_before_a_crash_does_not_make_it_oom(monkeypatch):
    """An OOM that was caught (a fallback taken) and a different error raised while handling it: the cell fails as
    that error says, the OOM named as what was being handled."""
    def load(*args, **kwargs):
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        except torch.cuda.OutOfMemoryError:
            raise ValueError("config.json: hidden_size 4097 is not a multiple of num_attention_heads 32")

    monkeypatch.setattr("harness.cell.run.load_model", load)
    out = run_cell(CellSpec(model="qwen3-0.6b", tiny=True))
    assert out.status == Status.EAGER_FAIL
    assert out.reason.startswith("ValueError: config.json") and "raised while handling OutOfMemoryError" in out.reason


@pytest.mark.parametrize("flag,axis,value", [("--quant", "quant", "fp8"), ("--parallel", "parallel", "tp16")])
def test_a_quant_or_parallel_the_runtime_lacks_is_unsupported_before_loading(flag, axis, value, capsys, monkeypatch):
    """Not the none/tp1 cell under another name: unsupported, in the matrix pre-check's words, and no model built."""
    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded for a cell the runtime cannot run")

    monkeypatch.setattr("harness.cell.run.load_model", no_load)
    rc = main(["cell", "--model", "qwen3-0.6b", "--tiny", "--graph", "piecewise", flag, value, "--seed", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["status"] == "unsupported" and out["spec"][axis] == value
    cell = expand(Matrix.model_validate({"name": "p", "axes": {"model": ["qwen3-0.6b:tiny"], axis: [value]}}))[0]
    assert out["reason"] == precheck(cell, capabilities(), {})
    assert out["metrics"]["settings"]["seed"] == 3 and out["metrics"]["settings"]["top_k"] == 5  # its settings, for the repro command


def test_mla_cells_run_on_sdpa_and_flex(capsys):
    """Kimi-K2's card (model_type kimi_k2, published with remote code) runs as DeepSeek-V3, absorbed MLA over the
    latent cache: its KV bytes per token recorded, on sdpa and on flex (its wide 576/512-dim head tiles)."""
    for attention in ("sdpa", "flex"):
        rc = main(["cell", "--model", "kimi-k2", "--tiny", "--graph", "full", "--attention", attention, "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["status"] == "pass", (attention, out["reason"])
        assert out["metrics"]["memory"]["kv_bytes_per_token"] == (32 + 8) * 2 * 4  # (latent + rope) × 2 layers × float32


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/no/such/config.json"], "not a directory, a config.json file"),
        (["--model", "qwen3-0.6b", "--device", "cuda"], "no CUDA GPU"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(args, message, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    rc = main(["cell", "--tiny", "--graph", "piecewise", *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_bad_json_config_names_the_file(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert main(["cell", "--model", str(bad), "--tiny", "--graph", "piecewise"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not valid JSON" in err


def test_bad_flag_value_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as e:
        main(["cell", "--model", "qwen3-0.6b", "--graph", "piecewise", "--max-tokens", "-4"])
    assert e.value.code == 2
    assert "argument --max-tokens: expected a token count from 1 to 1048576, got -4" in capsys.readouterr().err


def test_models_lists_every_card(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for cid in ("qwen3-0.6b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "grok-2"):
        assert cid in out


@pytest.mark.slow
def test_piecewise_with_inductor_compiler_passes():
    r = run_cell(CellSpec(model="qwen3-30b-a3b", tiny=True, graph="piecewise", compiler="inductor", max_tokens=32, max_new_tokens=4))
    assert r.status == "pass", r.reason
    assert r.metrics.capture.compile_s > 0 and r.metrics.capture.pieces == 3


def test_unreachable_hub_id_offline_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    rc = main(["cell", "--model", "pcg-test-org/no-such-model-xyz", "--tiny", "--graph", "piecewise"])
    assert rc == 2
    assert "not in the local cache and the hub cannot be reached" in capsys.readouterr().err


def _perturb_second_eager_run(monkeypatch, delta):
    """Make the eager engine's second suite run differ from its first by `delta` on every output logprob."""
    from pcg_core.engine.engine import Engine

    real_generate = Engine.generate
    seen = {}

    def generate(self, prompts, *args, **kwargs):
        outs = real_generate(self, prompts, *args, **kwargs)
        if self.config.capture.backend == "disabled":
            key = (id(self), tuple(map(tuple, prompts)))
            if key in seen:
                for o in outs:
                    o.output_logprobs = [x + delta for x in o.output_logprobs]
            seen[key] = True
        return outs

    monkeypatch.setattr(Engine, "generate", generate)


def test_eager_noise_within_bounds_is_recorded_not_fatal(monkeypatch):
    _perturb_second_eager_run(monkeypatch, 1e-5)
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, graph="full", max_tokens=32, max_new_tokens=2))
    assert r.status == "pass", r.reason
    assert r.metrics.judge.eager_bitwise_deterministic is False
    assert abs(r.metrics.judge.eager_self_diff.max_output_logprob_diff - 1e-5) < 1e-6


def test_eager_noise_beyond_bounds_is_eager_nondeterministic(monkeypatch):
    _perturb_second_eager_run(monkeypatch, 0.5)
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, graph="full", max_tokens=32, max_new_tokens=2))
    assert r.status == "eager_nondeterministic"
    assert "beyond the judge's bounds" in r.reason


def test_first_diverging_piece_is_named():
    """A capture backend whose piece 1 is wrong inside its CUDA graph / replay: the reason names piece 1."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "launcher"))
    try:
        import fault_backends  # noqa: F401
    finally:
        sys.path.pop(0)
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, layers=3, graph="test_perturb_piece", max_tokens=32, max_new_tokens=2))
    assert r.status == "fail_accuracy", r
    assert "first diverging piece 1 (up to attention 1)" in r.reason, r.reason
    assert r.metrics.judge.diverging_piece == "piece 1 (up to attention 1)"


def test_int4_cells_refuse_what_they_cannot_run_yet():
    """awq/gptq run on dense and MoE models (synthetic, gpt-oss's transposed, biased experts included:
    tests/pcg_core/quant/layers/test_quant_gpt_oss_experts.py; or a checkpoint in the format: test_int4_checkpoint_cells.py). A
    card without such a checkpoint (dense or MoE, gpt-oss's too: its card declares MXFP4 only) is unsupported
    before any weight is built."""
    real = run_cell(CellSpec("llama-3.1-8b", weights="real", quant="awq"))
    assert real.status == Status.UNSUPPORTED and "declares no awq checkpoint" in real.reason
    moe = run_cell(CellSpec("qwen3-30b-a3b", weights="real", quant="gptq"))
    assert moe.status == Status.UNSUPPORTED and "declares no gptq checkpoint" in moe.reason
    assert moe.metrics.quant.quant_layers is None  # stopped before quantizing anything
    oss = run_cell(CellSpec("gpt-oss-120b", weights="real", quant="awq"))
    assert oss.status == Status.UNSUPPORTED and "declares no awq checkpoint" in oss.reason, oss.reason
    assert oss.metrics.quant.quant_layers is None


def test_real_weights_load_the_checkpoint_published_in_the_scheme():
    from harness.cell.run import resolve_model, run_cell

    assert resolve_model(CellSpec("llama-3.1-8b", weights="real", quant="int8_w8a8")) == "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8"
    assert resolve_model(CellSpec("llama-3.1-8b", weights="real")) == "meta-llama/Llama-3.1-8B-Instruct"
    assert isinstance(resolve_model(CellSpec("llama-3.1-8b", tiny=True, quant="int8_w8a8")), dict)  # synthetic: the config
    out = run_cell(CellSpec("qwen3-8b", weights="real", quant="int8_w8a8"))  # stops before anything is loaded
    assert out.status == Status.UNSUPPORTED and "declares no int8_w8a8 checkpoint" in out.reason


def test_a_real_quantized_moe_checkpoint_counts_its_experts_as_quantized_layers(tmp_path):
    """Real weights of a scheme: the loader's reading is the cell's, and its layer count matches what quantizing a
    synthetic model in memory counts (4 attention linears and 1 experts module per layer, 2 layers)."""
    from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
    from pcg_core.quant import SCHEMES, write_checkpoint

    data = shrink_config(read_config_file(CARDS_DIR / "configs" / "Qwen__Qwen3-30B-A3B.json"), tiny=True, layers=2)
    model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    write_checkpoint(model, data, tmp_path, "compressed-tensors", SCHEMES["fp8_per_token"])
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant="fp8_per_token", max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == 10
    none = run_cell(CellSpec(str(tmp_path), weights="real", max_tokens=64, max_new_tokens=2))
    assert none.status == Status.UNSUPPORTED and "fp8_per_token" in none.reason


def test_the_candidate_s_attention_kernels_are_counted_at_capture_and_in_the_run(monkeypatch):
    """metrics.capture.attention_*: the candidate's kernels built (here one per token count the flex backend meets, as
    its compiled kernels are on CUDA), those first met after capture, and their build seconds — read from the
    candidate's backend, not the eager engine's."""
    from pcg_core.attention.flex import FlexBackend

    backends: list = []
    forward = FlexBackend.forward

    def counting(self, q, k, v, out, params, md):
        if not hasattr(self, "seen"):
            self.seen = set()
            backends.append(self)
        self.seen.add(md.num_tokens)
        return forward(self, q, k, v, out, params, md)

    at_run: list[int] = []  # the candidate's sizes when its run phase starts (run_cell's own phase hook)

    def phase(name: str) -> None:
        if name == "run":
            at_run.append(len(backends[-1].seen))

    monkeypatch.setattr(FlexBackend, "forward", counting)
    monkeypatch.setattr(FlexBackend, "kernels_built", lambda self: (len(getattr(self, "seen", ())), 0.5 * len(getattr(self, "seen", ()))))
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, attention="flex", graph="breakable", max_tokens=32, max_new_tokens=4),
                 on_phase=phase)
    c = r.metrics.capture
    assert r.status == Status.PASS, r.reason
    assert c.attention_kernels == len(backends[-1].seen) and c.attention_build_s == 0.5 * c.attention_kernels
    assert len(at_run) == 1 and c.attention_kernels_in_run == c.attention_kernels - at_run[0] > 0  # sizes past the ladder
