"""The judge's reference layer (harness/cell/judge/reference.py) against faults that break eager and graph alike.

Each fault is planted in what pcg's eager and graph paths share (a quantized layer's forward, the attention
backend), never in the references (transformers' forward, the kernels' reference math: the twins bind their own
forwards per instance). So graph = eager holds bitwise and only the reference layer can see them: the cell must
fail with a reason that is the reference layer's alone, and the same cell without the fault must pass.
"""

from __future__ import annotations

import pytest
import torch

from harness.cards import find_card, load_cards
from harness.cell import CellSpec, run_cell
from harness.cell.judge.reference import reference_cases
from harness.cell.prompts import prompt_suite
from pcg_core.attention.sdpa import SdpaBackend
from pcg_core.model import load_model
from pcg_core.quant import QuantLinear, get_scheme, quantize_model
from pcg_core.quant.layers.int4_linear import Int4Linear
from pcg_core.quant.schemes.nibbles import dequantize_codes, unpack_nibbles
from pcg_core.quant.schemes.w8a8 import reference_linear


def _cell(model: str = "qwen3-0.6b", quant: str = "none", graph: str = "breakable", **kw):
    return run_cell(CellSpec(model=model, quant=quant, tiny=True, graph=graph, max_tokens=64, max_new_tokens=4, **kw))


def _scale_rolled(self: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """A per-channel scale read one output channel off (a mis-strided scale pointer)."""
    x2 = x.reshape(-1, self.in_features)
    out = reference_linear(x2, self.weight, self.weight_scale.roll(1, 0), self.scheme, self.input_scale, self.bias)
    return out.reshape(*x.shape[:-1], self.out_features)


def _zeros_row_off(self: Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """Group zero points read one output row off (a mis-strided zeros pointer). Tiny models' widths are one group
    wide, so a wrong group size cannot show here; tests/pcg_core's kernel tests plant that one at real widths."""
    x2 = x.reshape(-1, self.in_features)
    if self.perm is not None:
        x2 = x2.index_select(1, self.perm)
    w = dequantize_codes(unpack_nibbles(self.qweight, 1), self.scales, self.zeros.roll(1, 0), self.group)
    out = torch.nn.functional.linear(x2.float(), w, None if self.bias is None else self.bias.float()).to(x.dtype)
    return out.reshape(*x.shape[:-1], self.out_features)


def _mask_one_short(self: SdpaBackend, md) -> None:
    """Causal mask off by one: each token misses its own key (`<` for `<=`; position 0 keeps its own, or its row
    would be empty)."""
    c, n = self.cache, md.num_tokens
    buf = self._mask if n <= self.max_tokens else torch.empty(n, c.num_slots, dtype=torch.bool, device=self.device)
    self.mask = buf[:n]
    torch.eq(md.seq_ids[:, None], c.slot_seq[None, : c.num_slots], out=self.mask)
    pos, slot_pos = md.positions[:, None], c.slot_pos[None, : c.num_slots]
    self.mask.logical_and_((slot_pos < pos) | ((slot_pos == 0) & (pos == 0)))


FAULTS = {
    "int8 scale read one channel off": ("int8_w8a8", QuantLinear, "forward", _scale_rolled),
    "awq zero points read one row off": ("awq", Int4Linear, "forward", _zeros_row_off),
    "attention mask one short": ("none", SdpaBackend, "begin_forward", _mask_one_short),
}


@pytest.mark.parametrize("graph", ["breakable", "piecewise"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_eager_shares_is_caught_by_the_reference_layer_alone(fault, graph, monkeypatch):
    quant, cls, attr, planted = FAULTS[fault]
    monkeypatch.setattr(cls, attr, planted)
    r = _cell(quant=quant, graph=graph)
    ref = r.metrics.judge.reference
    assert r.status == "fail_accuracy" and ref.status == "fail", (r.status, r.reason)
    # graph = eager held: the judge's own layers saw nothing, the reason is the reference layer's alone
    assert r.reason.startswith("reference layer: FAIL"), r.reason
    assert r.metrics.judge.max_same_padding_diff == 0.0 and r.metrics.judge.token_match == 1.0


@pytest.mark.parametrize("quant", ["none", "int8_w8a8", "awq"])
def test_the_same_cells_pass_without_the_fault(quant):
    r = _cell(quant=quant)
    ref = r.metrics.judge.reference
    assert r.status == "pass" and ref.status == "pass", (r.reason, ref)
    assert ref.positions > 100 and ref.max_logprob_diff <= ref.max_bound
    assert (ref.kernel_rel is not None) == (quant != "none")


def test_the_kernel_check_names_the_layer_a_kernel_error_enters(monkeypatch):
    """A 2% scale error in every quantized linear: the per-layer hidden-state check names the first layer it shows
    at. Not attention 0's input: Qwen3's per-head q_norm takes a uniform scale off q_proj's output; layer 0's o_proj
    and MLP carry it into attention 1's."""
    def off_by_a_little(self: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        out = reference_linear(x2, self.weight, self.weight_scale * 1.02, self.scheme, self.input_scale, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    monkeypatch.setattr(QuantLinear, "forward", off_by_a_little)
    r = _cell(quant="int8_w8a8")
    ref = r.metrics.judge.reference
    assert ref.status == "fail" and ref.kernel_rel > ref.kernel_bound, ref
    assert ref.kernel_layer == "attention 1's input"


def test_a_reference_that_cannot_run_says_not_measured_and_keeps_the_verdict(monkeypatch):
    import harness.cell.judge.reference as reference

    def refuse(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted)")

    monkeypatch.setattr(reference, "_hf_next_tokens", refuse)
    r = _cell()
    assert r.status == "pass" and r.metrics.judge.reference.status == "not_measured"
    assert "reference layer: not measured: OutOfMemoryError" in r.reason


def test_an_eager_output_of_the_wrong_shape_fails_rather_than_going_unmeasured(monkeypatch):
    """A logprob missing from eager's output (an engine that lost a row) is a wrong eager, not a reference that
    could not run: the cell fails."""
    import pcg_core.engine.engine as engine_mod

    real = engine_mod.Engine._take

    def drop_one(self, outs, fwd, hidden, top_k, prompt_logprobs):
        tokens = real(self, outs, fwd, hidden, top_k, prompt_logprobs)
        for o in outs:
            if o.prompt_logprobs and len(o.prompt_logprobs) > 3:
                o.prompt_logprobs.pop()
        return tokens

    monkeypatch.setattr(engine_mod.Engine, "_take", drop_one)
    r = _cell()
    assert r.status == "fail_accuracy" and r.metrics.judge.reference.status == "fail", (r.status, r.reason)
    assert "logprobs for the" in r.reason


def test_the_cases_cover_several_sequences_decode_and_chunked_prefill():
    cases = prompt_suite(list(range(4, 33, 4)) + list(range(48, 65, 16)), 1000)
    chosen, prefill = reference_cases(cases)
    names = [c.name for c in chosen]
    assert any(n.startswith("decode_") for n in names) and any(n.startswith("chunked_") for n in names)
    assert any(len(c.prompts) > 1 for c in chosen) and len(prefill.prompts) == 1


def test_the_float32_runs_use_the_cells_attention_where_it_computes_float32_else_sdpa():
    from harness.cell.judge.padding import float32_attention

    assert float32_attention("flex", "cpu") == "flex" and float32_attention("sdpa", "cpu") == "sdpa"
    assert float32_attention("varlen", "cpu") == "sdpa"  # FlashAttention has no float32 kernel (seen on the H200)
    # flex on CUDA would compile its float32 kernels for the check alone (past 200 s of DeepSeek-V3:4's judge)
    assert float32_attention("flex", "cuda") == "sdpa" and float32_attention("flex", "cuda:1") == "sdpa"
    assert float32_attention("sdpa", "cuda") == "sdpa" and float32_attention("varlen", "cuda") == "sdpa"


def _one_card_per_architecture() -> list[str]:
    by_arch: dict[str, str] = {}
    for card_id, card in sorted(load_cards().items()):
        by_arch.setdefault(card.architecture, card_id)
    return sorted(by_arch.values())


# every architecture of the cards (our own modules too: Grok-2's eager attention once read row 0 of a batch only, and
# its reference layer was not measured on the H100, 2026-12-08), quantized kernels' reference math on an MoE
@pytest.mark.parametrize("model,quant", [*((m, "none") for m in _one_card_per_architecture()),
                                         ("qwen3-30b-a3b", "fp8_block"), ("qwen3-30b-a3b", "awq"),
                                         ("gpt-oss-120b", "nvfp4")])
def test_sequences_of_one_length_batched_give_what_one_at_a_time_gives(monkeypatch, model, quant):
    """The reference runs text sequences of one length as rows of one forward (BATCH_TOKENS a forward): each row's
    logprobs, argmax and top logprob must be what that sequence alone gives — a batch that mixed rows (a target
    taken from another row) would not be."""
    import harness.cell.judge.reference as reference

    card = find_card(model)
    assert card is not None
    loaded = load_model(card.config, tiny=True, layers=2, seed=3).model
    if quant != "none":  # the reference twin's kernels as their reference math, routed experts on their rows
        quantize_model(loaded, get_scheme(quant))
    model = reference._hf_twin(loaded, True, reference._attention_implementation(loaded))
    g = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    lengths = [5, 9, 5, 5, 2, 9, 5, 17]
    seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    monkeypatch.setattr(reference, "BATCH_TOKENS", 8)  # the four of length 5 two to a forward, the longer ones alone
    batched = reference._hf_next_tokens(model, seqs, torch.device("cpu"), [None] * len(seqs))
    monkeypatch.setattr(reference, "BATCH_TOKENS", 1)
    alone = reference._hf_next_tokens(model, seqs, torch.device("cpu"), [None] * len(seqs))
    for seq, b, a in zip(seqs, batched, alone):
        assert all(x.shape == (len(seq) - 1,) for x in b)
        torch.testing.assert_close(b[0], a[0], rtol=0, atol=1e-5)
        assert torch.equal(b[1], a[1])
        torch.testing.assert_close(b[2], a[2], rtol=0, atol=1e-5)
