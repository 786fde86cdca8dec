"""The prompt suite, derived from the bucket ladder and aimed at every way a captured graph can go stale.

A graph is recorded once per bucket and replayed for every batch padded to it, so a bug hides wherever the suite
does not look: a bucket never replayed (the large ones), a size at a bucket's edge, a second batch with another
packed layout at the same bucket, decode batches whose membership changes, positions past the largest bucket,
state left over from the previous replay, and what a server does that one prompt does not: many sequences at
once, sequences joining a running decode batch, a later request starting from an earlier one's cached KV. A case
is one `generate()` call (`run_case`): one packed prefill (in chunks where the case says so), then decode steps of
the sequences still generating, sequences joining at the step the case gives (engine/schedule.py); a case of
several rounds is one call per round through one prefix cache. The cases run in order, so the layout cases are
consecutive forwards at one bucket and the last case repeats an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pcg_core.engine import Engine, PrefixCache, SequenceOutput
from pcg_core.known import parse_parallel
from pcg_core.model.vision import Image, image_tokens, is_vlm, patchify, synthetic_image

EDGE_NEW_TOKENS = 2  # decode steps after an edge-size prefill: enough to read the KV it wrote
MIN_DECODE_STEPS = 4  # the decode case needs a few steps for its batch to change membership
# Sequences packed into one forward by the concurrency cases (a serving engine's batch, vLLM's FULL-vs-PIECEWISE test
# runs up to 123): each level the ladder's largest bucket holds as a decode batch. A CPU cell runs the levels up to
# CPU_CONCURRENCY (an eager CPU forward of 256 short sequences costs minutes on flex, which compiles per shape).
CONCURRENCY = (64, 128, 256)
CPU_CONCURRENCY = 64


@dataclass(frozen=True)
class Case:
    """One generate() call: prompts packed into one prefill, each sequence decoding its own number of tokens
    (1: prefill only), the prefill split into forwards of at most `chunk` tokens when set."""

    name: str
    prompts: tuple[tuple[int, ...], ...]
    new_tokens: tuple[int, ...]
    chunk: int | None = None
    images: tuple[tuple[Image, ...], ...] | None = None  # a VLM's images, one tuple per prompt (None: text only)
    # Prompts per generate() call, in order, the calls sharing one prefix cache (a server's later requests starting
    # from the KV its earlier ones left); () : one call, no prefix cache.
    rounds: tuple[int, ...] = ()
    # The decode step each prompt joins at (0: the first prefill; a later one: packed after that step's decode rows,
    # as continuous batching does); None: all at once.
    join_at: tuple[int, ...] | None = None

    def round_parts(self) -> list[tuple[list[list[int]], list[int], list[list[Image]] | None, list[int] | None]]:
        """(prompts, new tokens, images, join_at) of each generate() call, in order."""
        cuts = self.rounds or (len(self.prompts),)
        if sum(cuts) != len(self.prompts):
            raise ValueError(f"case {self.name}: rounds {cuts} do not add up to its {len(self.prompts)} prompts")
        parts, start, lists = [], 0, self.image_lists
        for n in cuts:
            imgs = lists[start : start + n] if lists is not None else None
            joins = list(self.join_at[start : start + n]) if self.join_at is not None else None
            parts.append(([list(p) for p in self.prompts[start : start + n]], list(self.new_tokens[start : start + n]), imgs,
                          joins))
            start += n
        return parts

    @property
    def image_lists(self) -> list[list[Image]] | None:
        """images as generate() takes them."""
        return None if self.images is None else [list(i) for i in self.images]

    @property
    def prefill_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def kv_slots(self, page_size: int = 1) -> int:
        """KV slots the case needs: every prompt plus its room for generated tokens, in whole pages."""
        return sum(-(-(len(p) + max(self.new_tokens)) // page_size) * page_size for p in self.prompts)


def prefix_cacheable(text_config, parallel: str) -> bool:
    """Whether the cell runs the shared-prefix case: not for a hybrid's linear-attention layers (a cached prefix
    needs their recurrent state at its end, which pcg does not keep) nor data-parallel attention (each rank's cache
    holds only its own sequences) — Engine.pack_prompts refuses both, saying so."""
    mode = parse_parallel(parallel)
    data_parallel = mode.get("dp", 1) > 1 or mode.get("tp", 1) < mode.get("ep", 1)
    return "linear_attention" not in (getattr(text_config, "layer_types", None) or ()) and not data_parallel


def run_case(engine: Engine, case: Case, top_k: int, prompt_logprobs: bool = True) -> list[SequenceOutput]:
    """The case's generate() calls on `engine` (its rounds sharing a prefix cache made for the case), the outputs of
    every prompt in order."""
    cache = PrefixCache(engine.cache) if case.rounds else None
    outs: list[SequenceOutput] = []
    for prompts, new, images, join_at in case.round_parts():
        outs += engine.generate(prompts, new, top_k, prompt_logprobs=prompt_logprobs, chunk=case.chunk, images=images,
                                prefix_cache=cache, join_at=join_at)
    return outs


def ladder_regions(ladder: list[int]) -> list[list[int]]:
    """The ladder cut where its step changes: the fine steps at the bottom, the coarse ones above."""
    regions: list[list[int]] = []
    step = None
    for prev, b in zip([0, *ladder], ladder):
        if b - prev != step:
            regions.append([])
            step = b - prev
        regions[-1].append(b)
    return regions


def _split(total: int, parts: int) -> list[int]:
    """`total` tokens as `parts` unequal lengths ≥ 1 (the first short, the last long), summing to `total`."""
    parts = max(1, min(parts, total))
    weights = list(range(1, parts + 1))
    lengths = [max(1, total * w // sum(weights)) for w in weights]
    lengths[-1] += total - sum(lengths)
    if lengths[-1] < 1:  # rounding took too much from the last: give it back from the longest
        i = lengths.index(max(lengths))
        lengths[i] += lengths[-1] - 1
        lengths[-1] = 1
    return lengths


def layout_bucket(ladder: list[int]) -> int:
    """The bucket the layout cases share: the one nearest a quarter of the largest, at least 8 where the ladder
    has one, so it holds sequences of several lengths."""
    largest = ladder[-1]
    wide = [b for b in ladder if b >= 8] or [largest]
    return min(wide, key=lambda b: (abs(b - largest // 4), b))


def prompt_suite(ladder: list[int], vocab_size: int, seed: int = 0, max_new_tokens: int = 8,
                 model_config: Any = None, concurrency: int = CONCURRENCY[-1], page_size: int | None = None) -> list[Case]:
    """The cases, in the order they run: edge sizes per ladder region and at the largest bucket, layouts at one
    bucket, decode with changing membership, positions past every bucket, then a repeat of an earlier case. A VLM
    (model_config with a vision tower) gets image+text cases before the repeat (vision_cases); vocab_size is then
    the text-token limit (pcg_core.model.vision.text_token_limit), so no random token is an image placeholder.
    concurrency: the most sequences a concurrency case packs (CONCURRENCY's levels up to it). page_size: the KV
    cache's, for the shared-prefix case (shared_prefix_case); None: no such case (a model a prefix cache cannot serve)."""
    suite = _Suite(vocab_size, seed)
    largest = ladder[-1]
    steps = max(MIN_DECODE_STEPS, max_new_tokens)
    _edge_cases(suite, ladder, min(EDGE_NEW_TOKENS, max_new_tokens))
    firsts = _layout_cases(suite, ladder)
    _decode_cases(suite, ladder, steps, concurrency)
    # Positions past every bucket: a prompt one over the largest (prefill eager, decode replayed at positions
    # above it), and a chunked prefill whose later chunks replay the graphs at positions beyond the ladder.
    suite.add(f"above_max_{largest + 1}", [largest + 1], max_new_tokens)
    suite.add(f"chunked_{2 * largest + 3}", [largest + largest // 2, largest // 2 + 3], max_new_tokens, chunk=largest)
    cases = suite.cases
    if page_size is not None:
        cases.append(shared_prefix_case(page_size, ladder, suite.tokens, max_new_tokens))
    if model_config is not None and is_vlm(model_config):
        cases += vision_cases(ladder, model_config, suite.tokens, max_new_tokens)
    # Stale state: the second layout again, after every other case has replayed its bucket with other data.
    again = firsts[1] if len(firsts) > 1 else cases[0]
    cases.append(Case(f"repeat_{again.name}", again.prompts, again.new_tokens, again.chunk))
    return cases


class _Suite:
    """The cases as they are made: every prompt drawn from one seeded stream in the order the cases are made (so
    the suite is the same on every machine), and a name made twice kept once (its tokens drawn all the same)."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.cases: list[Case] = []
        self.seen: set[str] = set()

    def tokens(self, n: int) -> tuple[int, ...]:
        return tuple(torch.randint(0, self.vocab_size, (n,), generator=self.gen).tolist())

    def add(self, name: str, lengths: list[int], new: int | list[int], chunk: int | None = None,
            join_at: list[int] | None = None) -> Case:
        news = [new] * len(lengths) if isinstance(new, int) else new
        case = Case(name, tuple(self.tokens(n) for n in lengths), tuple(news), chunk,
                    join_at=tuple(join_at) if join_at is not None else None)
        if name not in self.seen:
            self.seen.add(name)
            self.cases.append(case)
        return case


def _edge_cases(suite: _Suite, ladder: list[int], edge_new: int) -> None:
    """Edge sizes: in every region one bucket exactly, one token short (two sequences: padding one row) and one
    token over (the next bucket, at its widest padding); the largest bucket too, whose +1 runs eagerly."""
    largest = ladder[-1]
    sizes_done: set[int] = set()
    reps = [r[len(r) // 2] for r in ladder_regions(ladder)]
    for k, b in enumerate([*reps, largest] if reps[-1] != largest else reps):
        region = f"r{k}" if k < len(reps) else "largest"
        for size, label, parts in ((b, "exact", 1), (b - 1, "minus1", 2), (b + 1, "plus1", 1)):
            if size < 1 or size in sizes_done:
                continue
            sizes_done.add(size)
            if size > largest:
                continue  # above_max below
            suite.add(f"{region}_{label}_{size}", _split(size, parts), edge_new)


def _layout_cases(suite: _Suite, ladder: list[int]) -> list[Case]:
    """Layouts: one bucket replayed in consecutive prefill-only forwards with other numbers, lengths and orders.
    Returns them: the suite's last case repeats the second."""
    b = layout_bucket(ladder)
    below = max([x for x in ladder if x < b], default=0)
    short = max(below + 1, b - 3)
    a = max(1, b // 3)
    layouts = [[b], [a, b - a], [b - a, a], [1, *_split(b - 3, 3), 1, 1] if b >= 6 else [b], _split(short, 3)]
    firsts = []
    for i, lengths in enumerate(layouts):
        lengths = [n for n in lengths if n > 0]
        firsts.append(suite.add(f"layout_{b}_{i}_" + "-".join(map(str, lengths)), lengths, 1))
    return firsts


def _decode_cases(suite: _Suite, ladder: list[int], steps: int, concurrency: int) -> None:
    """Decode batches whose membership changes from step to step, a few sequences, then many."""
    largest = ladder[-1]
    # Decode: sequences of different lengths that stop at different steps, so each decode step's batch has other
    # members; all in the first step, two more than the smallest bucket, so the decode batches cross its edge.
    n = ladder[0] + 2
    suite.add(f"decode_{n}_seqs", [1 + (7 * i) % max(2, min(largest, 24)) for i in range(n)],
              [2 + i % (steps - 1) for i in range(n)])
    # Concurrency: many sequences of mixed lengths in one prefill (chunked at the largest bucket, so each chunk holds
    # dozens of them), then decode batches that shrink across bucket edges as sequences finish at different steps,
    # while every fourth sequence joins later: its prompt packed after the decode rows of step 1, 2 or 3.
    for n in (c for c in CONCURRENCY if c <= min(largest, concurrency)):
        lengths = [1 + (5 * i) % max(1, min(8, 4 * largest // n - 1)) for i in range(n)]  # 1–8 tokens: a serving mix
        joins = [1 + (i // 4) % (steps - 1) if i % 4 == 3 else 0 for i in range(n)]
        suite.add(f"concurrent_{n}_seqs", lengths, [1 + (i * 5) % steps for i in range(n)],
                  chunk=largest if sum(lengths) > largest else None, join_at=joins)


def shared_prefix_case(page_size: int, ladder: list[int], tokens: Any, max_new_tokens: int) -> Case:
    """Three rounds of requests through one prefix cache, fresh prompts among them. Round 1 writes A (three pages and
    a bit) and a fresh prompt. Round 2 starts B from A's first two pages (whole pages shared), C from two pages and
    half of the third (a page boundary inside the prefix: the half copied), D from less than A's first page (a copy
    only), beside a fresh prompt. Round 3 starts E from B (A's pages, then B's own page, which B wrote past A's) and
    runs A again (all of it cached but its last token). Prefills are chunked at the largest bucket, so a cached
    prefix's positions run on past the ladder."""
    ps, new = page_size, min(3, max_new_tokens)
    a = tokens(3 * ps + 5)
    b = (*a[: 2 * ps], *tokens(7))
    c = (*a[: 2 * ps + ps // 2], *tokens(6))
    d = (*a[: max(1, ps - 3)], *tokens(5))
    e = (*b, *tokens(4))
    prompts = (a, tokens(9), b, c, tokens(11), d, e, a)
    return Case(f"shared_prefix_{ps}", prompts, (new,) * len(prompts), chunk=ladder[-1], rounds=(2, 4, 2))


def vision_cases(ladder: list[int], config: Any, tokens: Any, max_new_tokens: int) -> list[Case]:
    """Image+text cases: images of several sizes in prompts packed with text-only ones in one batch (decoding, so
    each sequence's rope delta is used), and an image whose last placeholder is the last row of a bucket (the
    prefill chunked at that bucket, so the image ends exactly at a forward's edge and its text resumes in the next)."""
    side = config.vision_config.patch_size * config.vision_config.spatial_merge_size

    def image(rows: int, cols: int, seed: int) -> Image:  # rows × cols merged tokens
        return patchify(synthetic_image(rows * side, cols * side, seed=seed), config.vision_config)

    cases = []
    small, wide, tall = image(1, 2, 11), image(2, 3, 12), image(3, 2, 13)
    prompts = [(*tokens(3), *image_tokens(config, small), *tokens(2)), tokens(6),
               (*tokens(2), *image_tokens(config, wide), *tokens(4), *image_tokens(config, tall), *tokens(1)), tokens(3)]
    images = ((small,), (), (wide, tall), ())
    new = [max_new_tokens, 2, max_new_tokens, 1]
    cases.append(Case(f"vision_mixed_{sum(len(p) for p in prompts)}", tuple(prompts), tuple(new), None, images))
    edge = image(2, 2, 14)
    n_img = len(image_tokens(config, edge)) - 1  # vision start + placeholders: the end token opens the next chunk
    b = next((x for x in ladder if x > n_img + 1), None)
    if b is not None:
        prompt = (*tokens(b - n_img), *image_tokens(config, edge), *tokens(3))
        cases.append(Case(f"vision_edge_{b}", (prompt,), (max_new_tokens,), b, ((edge,),)))
    return cases


def repeat_of(case: Case) -> str | None:
    """The name of the case `case` repeats, or None."""
    return case.name.removeprefix("repeat_") if case.name.startswith("repeat_") else None


def latency_token_counts(max_tokens: int) -> list[int]:
    return [n for n in (8, 32, 128, 512, 2048) if n <= max_tokens]
