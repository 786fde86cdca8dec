"""Qwen3-Next (Gated DeltaNet + gated full attention + MoE with a shared expert) over pcg::linear_attention and the
per-sequence state pool, against transformers' own eager forward with its own cache."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from pcg_core import CaptureConfig, Engine, EngineConfig, load_model
from pcg_core.errors import ConfigError
from pcg_core.linear_attention import op as linear_op
from pcg_core.linear_attention.state import LinearStatePool
from pcg_core.model.loader import shrink_config
from pcg_core.model.qwen3_next import is_gated_deltanet
from pcg_helpers import compare_outputs, prompts_of

CONFIG = "Qwen__Qwen3-Next-80B-A3B-Instruct.json"
LENGTHS = [70, 5, 1, 33]  # 70: more than one 64-token chunk of the chunked rule; 1: a one-token prefill
NEW = 9  # the prefill's token, then 8 decode steps
TOL = 1e-4  # float32: summation order only


@pytest.fixture(scope="module")
def lm(configs):
    return load_model(configs / CONFIG, tiny=True)


@pytest.fixture(scope="module")
def prompts(lm):
    return prompts_of(LENGTHS, lm.config.vocab_size, seed=3)


def _engine(lm, backend="disabled", max_tokens=128):
    return Engine(lm.model, EngineConfig(capture=CaptureConfig(backend=backend, max_tokens=max_tokens), kv_slots=512))


def test_tiny_trim_keeps_a_full_attention_layer(configs):
    import json

    data = json.loads((configs / CONFIG).read_text())
    assert shrink_config(data, tiny=True)["layer_types"] == ["linear_attention", "full_attention"]
    assert shrink_config(data, layers=1)["layer_types"] == ["full_attention"]
    assert shrink_config(data, layers=4)["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert shrink_config(data, layers=6)["layer_types"][4:] == ["linear_attention"] * 2  # the pattern, not forced


def test_gated_deltanet_layers_run_the_split_op(lm):
    assert sum(is_gated_deltanet(m) for m in lm.model.modules()) == 1
    assert lm.config.linear_num_value_heads == 2 * lm.config.linear_num_key_heads  # grouped value heads kept


def _transformers_steps(lm, prompt, tokens):
    """Log-softmax rows of transformers' own eager model (its own Gated DeltaNet, cache and experts) for the prompt's
    last position, then one decode step per token of `tokens` but the last, through its cache."""
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(lm.config), attn_implementation="eager",
                                           experts_implementation="eager", dtype=lm.model.dtype).eval()
    ref.load_state_dict(lm.model.state_dict())
    rows = []
    with torch.no_grad():
        out = ref(input_ids=torch.tensor([prompt]), use_cache=True)
        rows.append(out.logits[0, -1])
        for t in tokens[:-1]:
            out = ref(input_ids=torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)
            rows.append(out.logits[0, -1])
    return torch.log_softmax(torch.stack(rows).float(), -1)


def test_matches_transformers_eager_prefill_and_8_decode_steps(lm, prompts):
    outs = _engine(lm).generate(prompts, max_new_tokens=NEW)
    for prompt, o in zip(prompts, outs):
        want = _transformers_steps(lm, prompt, o.output_ids)
        assert o.output_ids == want.argmax(-1).tolist()
        got_top = torch.tensor(o.output_topk_logprobs)
        want_top = want.gather(1, torch.tensor(o.output_topk_ids))
        assert (got_top - want_top).abs().max() < TOL


def test_packed_batch_gives_each_sequence_its_own_outputs(lm, prompts):
    engine = _engine(lm)
    packed = engine.generate(prompts, max_new_tokens=NEW, prompt_logprobs=True)
    alone = [engine.generate([p], max_new_tokens=NEW, prompt_logprobs=True)[0] for p in prompts]
    assert compare_outputs(alone, packed, TOL) == []  # GEMMs of other row counts: summation order


def _stale_state_mismatches(lm, prompts) -> list[str]:
    """A batch run after another on the same engine (the state slots reused) against the same batch on a new one."""
    engine = _engine(lm)
    engine.generate(prompts[::-1], max_new_tokens=NEW)
    second = engine.generate(prompts, max_new_tokens=4)
    return compare_outputs(_engine(lm).generate(prompts, max_new_tokens=4), second, 1e-6)


def test_state_slot_is_reset_between_batches(lm, prompts, monkeypatch):
    assert _stale_state_mismatches(lm, prompts) == []
    monkeypatch.setattr(LinearStatePool, "_zero", lambda self, slot: None)  # planted: a reused slot keeps its state
    assert _stale_state_mismatches(lm, prompts) != []


def _padding_rows_of_the_op(lm, prompts, monkeypatch) -> list[torch.Tensor]:
    """Each linear_attention output's padding rows in a forward padded to 128, its buffer handed over as garbage."""
    seen, real = [], linear_op._linear_attention

    def spy(*args):
        out = args[5]
        out.fill_(float("nan"))  # what torch.empty may hold
        real(*args)
        seen.append(out[sum(map(len, prompts)):].clone())

    monkeypatch.setattr(linear_op, "_linear_attention", spy)
    engine = _engine(lm)
    hidden = engine.forward(engine.prefill_batch(prompts), eager=True, pad_to=128)
    assert torch.isfinite(hidden).all()
    return seen


def test_padding_rows_of_linear_attention_are_exact_zeros(lm, prompts, monkeypatch):
    rows = _padding_rows_of_the_op(lm, prompts, monkeypatch)
    assert rows and all(r.shape[0] == 128 - sum(LENGTHS) and (r == 0).all() for r in rows)
    monkeypatch.setattr(linear_op, "_clear", lambda out: None)  # planted: padding rows left as the buffer held them
    rows = _padding_rows_of_the_op(lm, prompts, monkeypatch)
    assert not all((r == 0).all() for r in rows)


def test_a_forward_run_again_gives_the_same_output(lm, prompts):
    """The judge runs a step eagerly unpadded, padded and again: the states must not advance per run."""
    engine = _engine(lm)
    batch = engine.prefill_batch(prompts)
    first = engine.forward(batch).clone()
    assert torch.equal(engine.forward(batch), first)
    # padded: GEMMs over other row counts, summation order only (an advanced state would be far off)
    assert (engine.forward(batch, eager=True, pad_to=128) - first).abs().max() < 1e-5
    assert torch.equal(engine.forward(batch), first)


@pytest.mark.parametrize("backend", ["piecewise", "breakable"])
def test_graph_backends_match_eager(lm, prompts, backend):
    want = _engine(lm).generate(prompts, max_new_tokens=4, prompt_logprobs=True)
    got = _engine(lm, backend).generate(prompts, max_new_tokens=4, prompt_logprobs=True)
    assert compare_outputs(want, got, 1e-5) == []


def test_full_capture_is_refused_with_the_reason(lm):
    with pytest.raises(ConfigError, match="linear-attention"):
        _engine(lm, "full")


def test_piecewise_cuts_at_both_split_ops_and_knows_which_may_be_graphed(lm):
    """Two layers, one linear and one full: two split ops, three pieces; only attention's may get a graph of its own
    (piecewise graphs split ops on CUDA where the attention backend's op is capturable)."""
    from pcg_core.capture.piecewise import split_at_split_ops  # noqa: F401 - the splitter the engine used
    from pcg_core.split_ops import split_op_names, uncapturable_split_op_in

    assert {"pcg::attention", "pcg::linear_attention"} <= set(split_op_names())
    engine = _engine(lm, "piecewise")
    assert (engine.stats.pieces, engine.stats.split_ops) == (3, 2)
    gm = engine.backend.split_gm
    splits = [n for n, _ in gm.named_children() if int(n.rsplit("_", 1)[1]) % 2 == 1]
    assert [uncapturable_split_op_in(getattr(gm, n)) for n in splits] == [True, False]  # linear layer 0, full layer 1


def test_chunked_rule_agrees_with_the_token_by_token_scan():
    """transformers' chunked fallback (prefill) against the recurrence written out (decode's step), from a nonzero
    state, 70 tokens (two chunks), grouped heads already repeated."""
    from pcg_core.linear_attention.gdn import chunked_rule, recurrent_rule

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(70, 4, 16, generator=g), torch.randn(70, 4, 16, generator=g)
    v = torch.randn(70, 4, 16, generator=g)
    decay = -torch.rand(70, 4, generator=g) * 0.5
    beta = torch.rand(70, 4, generator=g)
    state = torch.randn(4, 16, 16, generator=g) * 0.1
    o1, s1 = chunked_rule(q, k, v, decay, beta, state)
    o2, s2 = recurrent_rule(q, k, v, decay, beta, state)
    assert (o1 - o2).abs().max() < 1e-4 and (s1 - s2).abs().max() < 1e-4
    o3, _ = recurrent_rule(q, k, v, decay, beta, torch.zeros_like(state))
    assert (o3 - o2).abs().max() > 1e-2  # the initial state matters: the check would see it dropped


def test_chunked_prefill_continues_the_states(lm, prompts):
    """Prefill cut into forwards of 16 tokens: a sequence's later chunk starts from the state its earlier one left."""
    engine = _engine(lm)
    whole = engine.generate(prompts, max_new_tokens=4, prompt_logprobs=True)
    assert compare_outputs(whole, engine.generate(prompts, max_new_tokens=4, prompt_logprobs=True, chunk=16), TOL) == []
