"""The prompt suite is derived from the ladder by rules, whatever the ladder: each rule checked on several."""

import pytest

from harness.cell.prompts import ladder_regions, layout_bucket, prompt_suite, repeat_of
from pcg_core.config import CaptureConfig, default_bucket_ladder

LADDERS = [default_bucket_ladder(64), default_bucket_ladder(4096), default_bucket_ladder(32), [3, 7, 50], [16], [1, 2, 4, 8]]


def _bucket(ladder, n):
    return CaptureConfig(buckets=list(ladder)).bucket_for(n)


def test_regions_cut_where_the_step_changes():
    assert ladder_regions([4, 8, 12, 28, 44, 60, 64]) == [[4, 8, 12], [28, 44, 60], [64]]
    regions = ladder_regions(default_bucket_ladder(4096))
    assert [r[1] - r[0] for r in regions] == [4, 16, 32, 64, 256]
    assert sum(regions, []) == default_bucket_ladder(4096)


@pytest.mark.parametrize("ladder", LADDERS, ids=str)
def test_every_region_and_the_largest_bucket_get_edge_sizes(ladder):
    cases = prompt_suite(ladder, 1000, max_new_tokens=4)
    sizes = {c.prefill_tokens for c in cases if c.chunk is None}
    largest = ladder[-1]
    assert largest in sizes and largest + 1 in sizes  # exact at the top, and one over (runs eagerly)
    for region in ladder_regions(ladder):
        edges = [b for b in region if {b - 1, b, b + 1} <= sizes | {0}]
        assert edges, f"region {region} has no bucket with exact, -1 and +1 sizes"


@pytest.mark.parametrize("ladder", LADDERS, ids=str)
def test_one_bucket_replayed_with_several_layouts_in_consecutive_forwards(ladder):
    cases = prompt_suite(ladder, 1000)
    b = layout_bucket(ladder)
    run = [c for c in cases if c.name.startswith(f"layout_{b}_")]
    assert len(run) >= 3
    i = cases.index(run[0])
    assert cases[i : i + len(run)] == run  # consecutive
    assert all(set(c.new_tokens) == {1} for c in run)  # prefill only: no decode forward in between
    assert {_bucket(ladder, c.prefill_tokens) for c in run} == {b}
    layouts = {tuple(len(p) for p in c.prompts) for c in run}
    assert len(layouts) == len(run)
    if b >= 6:  # room for the same count in another order, and for another count
        assert any(tuple(reversed(x)) in layouts and len(x) > 1 and x != tuple(reversed(x)) for x in layouts)
        assert len({len(x) for x in layouts}) >= 3


@pytest.mark.parametrize("ladder", LADDERS, ids=str)
def test_decode_membership_changes_and_crosses_the_smallest_bucket(ladder):
    dec = [c for c in prompt_suite(ladder, 1000, max_new_tokens=2) if c.name.startswith("decode_")][0]
    new = list(dec.new_tokens)
    sizes = [sum(1 for n in new if n > step) for step in range(1, max(new))]  # sequences in each decode step
    assert sizes[0] > ladder[0]  # the first decode batch pads past the smallest bucket …
    assert min(sizes) <= ladder[0]  # … later ones fit it
    assert len(set(sizes)) >= 3


@pytest.mark.parametrize("ladder", LADDERS, ids=str)
def test_positions_past_every_bucket_and_a_final_repeat(ladder):
    cases = prompt_suite(ladder, 1000)
    largest = ladder[-1]
    chunked = [c for c in cases if c.name.startswith("chunked_")]
    assert chunked and chunked[0].chunk == largest and chunked[0].prefill_tokens > 2 * largest
    last = cases[-1]
    original = next(c for c in cases if c.name == repeat_of(last))
    assert original.prompts == last.prompts and cases.index(original) < len(cases) - 2


def test_the_suite_is_deterministic_per_seed():
    a, b = prompt_suite(default_bucket_ladder(64), 500, seed=3), prompt_suite(default_bucket_ladder(64), 500, seed=3)
    assert a == b and a != prompt_suite(default_bucket_ladder(64), 500, seed=4)
    assert len({c.name for c in a}) == len(a)
