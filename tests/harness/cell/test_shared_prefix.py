"""The shared-prefix case (prompts.shared_prefix_case): later requests start from the KV pages earlier ones left in a
prefix cache — whole pages shared read-only, the page a prefix ends inside copied — beside fresh prompts.

A prefix cache's fault sits in the engine, which the graph shares with eager, so graph = eager cannot see it
unless it is the graph's alone: the reference layer (transformers computes every sequence whole) must. Each fault
class is planted twice — in both engines (the reference layer catches it) and in the graph's engine only (the
suite's graph-vs-eager comparison catches it) — and the clean cell passes on every backend and cache that runs
here. The fault classes: a shared page written by the second request, a prefix's positions restarted at 0, a block
table that loses a shared page."""

from __future__ import annotations

import pytest

from harness.cards import find_card
from harness.cell import CellSpec, run_cell
from harness.cell.prompts import prefix_cacheable, prompt_suite, shared_prefix_case
from harness.cell.judge.reference import reference_cases
from harness.outcome import Status
from pcg_core.attention.kv_cache import KVCache
from pcg_core.engine import Engine
from pcg_core.engine.engine import Packed
from pcg_core.model import load_model
from pcg_core.engine.inputs import PackedBatch


def _tokens(n: int) -> tuple[int, ...]:
    return tuple(range(1, n + 1))


def test_three_rounds_share_whole_pages_a_page_boundary_and_a_later_sequence_s_own_page():
    case = shared_prefix_case(16, [8, 16, 32, 64], _tokens, 8)
    a, _, b, c, _, d, e, again = case.prompts
    assert case.rounds == (2, 4, 2) and case.chunk == 64 and again == a
    assert b[:32] == a[:32] and c[:40] == a[:40] and d[:13] == a[:13] and e[: len(b)] == b
    assert [len(p) for p, *_ in case.round_parts()] == [2, 4, 2]


def test_the_suite_has_it_where_a_prefix_cache_can_serve_the_model():
    ladder = [4, 8, 16, 32, 64]
    assert any(c.rounds for c in prompt_suite(ladder, 1000, page_size=128))
    assert not any(c.rounds for c in prompt_suite(ladder, 1000))
    chosen, _ = reference_cases(prompt_suite(ladder, 1000, page_size=16))
    assert "shared_prefix_16" in [c.name for c in chosen]
    text = lambda m: load_model(find_card(m).config, tiny=True, seed=0).config.get_text_config()  # noqa: E731
    assert prefix_cacheable(text("qwen3-0.6b"), "tp2") and prefix_cacheable(text("qwen3-0.6b"), "pp2")
    assert not prefix_cacheable(text("qwen3-next-80b-a3b"), "tp1")  # its recurrent state per prefix is not kept
    assert not prefix_cacheable(text("qwen3-30b-a3b"), "dp2") and not prefix_cacheable(text("qwen3-30b-a3b"), "ep2")


# Planted faults -------------------------------------------------------------------------------------------------


def _graph_only(engine: Engine, where: str) -> bool:
    """Whether the planted fault applies to this engine: both engines, or the graph's alone."""
    return where == "both" or engine.config.capture.backend != "disabled"


def _write_into_shared_page(monkeypatch, where: str) -> None:
    """The second request's first positions are given slots in the last page it shares, overwriting the prefix."""
    real = Engine._allocate

    def allocate(self, seq, length, match, prefix_cache):
        slots = real(self, seq, length, match, prefix_cache)
        if match.shared and _graph_only(self, where):
            ps, start = self.cache.page_size, len(match.shared) * self.cache.page_size
            for p in range(start + match.copied, min(length, start + ps)):
                slots[p] = match.shared[-1] * ps + p % ps
        return slots

    monkeypatch.setattr(Engine, "_allocate", allocate)


def _positions_from_zero(monkeypatch, where: str) -> None:
    """A sequence started from a cached prefix computes its prompt's rest at positions 0, 1, … instead of after it."""
    real = Engine.pack_prompts

    def pack(self, prompts, extra_slots, images=None, prefix_cache=None):
        packed = real(self, prompts, extra_slots, images, prefix_cache)
        if not _graph_only(self, where):
            return packed
        b = packed.batch
        positions = [p - packed.cached[s] for p, s in zip(b.positions, b.seq_ids)]
        return Packed(PackedBatch(b.token_ids, positions, b.seq_ids, b.slots), packed.seq_slots, packed.cached)

    monkeypatch.setattr(Engine, "pack_prompts", pack)


def _lose_a_shared_page(monkeypatch, where: str) -> None:
    """A sequence's block table, as attention reads it (seq_pages), loses the first page it shares."""
    real = Engine._allocate

    def allocate(self, seq, length, match, prefix_cache):
        slots = real(self, seq, length, match, prefix_cache)
        if match.shared and _graph_only(self, where):
            self.cache.seq_pages[seq, match.shared[0]] = False
        return slots

    monkeypatch.setattr(Engine, "_allocate", allocate)


FAULTS = {"shared_page_written": _write_into_shared_page, "positions_from_zero": _positions_from_zero,
          "lost_shared_page": _lose_a_shared_page}


def _cell(model: str = "qwen3-0.6b", attention: str = "sdpa", graph: str = "piecewise", **kw):
    return run_cell(CellSpec(model=model, tiny=True, attention=attention, graph=graph, max_tokens=64, max_new_tokens=4,
                             **kw))


@pytest.mark.parametrize("model,attention,graph,kv_cache", [
    ("qwen3-0.6b", "sdpa", "piecewise", "auto"), ("qwen3-0.6b", "flex", "full", "auto"),
    ("deepseek-v3", "flex", "breakable", "auto"), ("gpt-oss-120b", "sdpa", "full", "auto"),
    ("llama-3.1-8b", "sdpa", "breakable", "fp8_e4m3"),
])
def test_the_clean_cell_passes_with_its_reference(model, attention, graph, kv_cache):
    r = _cell(model, attention, graph, kv_cache=kv_cache)
    assert r.status == Status.PASS and r.metrics.judge.reference.status == "pass", (r.status, r.reason)


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("where", ["both", "graph"])
def test_each_fault_class_is_caught(monkeypatch, fault, where):
    FAULTS[fault](monkeypatch, where)
    r = _cell()
    assert r.status == Status.FAIL_ACCURACY, (r.status, r.reason)
    assert "shared_prefix_16" in r.reason, r.reason
    if where == "both":  # graph = eager: only the reference layer can tell
        assert r.metrics.judge.reference.status == "fail" and "reference layer" in r.reason, r.reason


def test_a_fault_is_caught_on_flex_and_mla_too(monkeypatch):
    _lose_a_shared_page(monkeypatch, "both")
    r = _cell("deepseek-v3", "flex", "full")
    assert r.status == Status.FAIL_ACCURACY and "shared_prefix_128" in r.reason, (r.status, r.reason)


def test_the_kv_cache_never_hands_a_shared_page_out_again():
    """What the first fault plants by hand, the cache itself cannot do: a page stays out of the free list while any
    block table or prefix cache holds it."""
    lm = load_model(find_card("qwen3-0.6b").config, tiny=True, seed=0)
    cache = KVCache(lm.config, 64, lm.model.dtype, lm.model.device, page_size=4)
    cache.allocate(0, 8)
    shared = cache.block_tables[0]
    cache.hold(shared[0])
    cache.release(0)
    cache.allocate(1, 6, shared=shared[:1])
    cache.allocate(2, 60 - 4)  # every other page
    assert not set(cache.block_tables[2]) & {shared[0]}
