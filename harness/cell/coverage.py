"""What the prompt suite made the graph candidate do: buckets replayed, packed layouts per bucket, decode steps,
positions past the ladder. Counted from the forwards themselves (the engine's listener), not from the suite's
intent, so a suite or ladder change that stops reaching a bucket shows up as a number that drops."""

from __future__ import annotations

from collections import defaultdict

from harness.cell.prompts import ladder_regions
from harness.metrics import SuiteCoverage
from pcg_core.engine.inputs import PackedBatch


def _layout(batch: PackedBatch) -> tuple[int, ...]:
    """Tokens per sequence, in batch order: the packed composition (count, lengths and order) of one forward."""
    lengths: list[int] = []
    last = None
    for s in batch.seq_ids:
        if s != last:
            lengths.append(0)
            last = s
        lengths[-1] += 1
    return tuple(lengths)


class CoverageCounter:
    """The graph engine's forward listener; `result()` is the cell's SuiteCoverage."""

    def __init__(self, ladder: list[int]):
        self.ladder = ladder
        self.layouts: dict[int, set[tuple[int, ...]]] = defaultdict(set)
        self.decode_steps = 0
        self.decode_layouts: set[tuple[int, ...]] = set()
        self.beyond = 0
        self.eager = 0

    def __call__(self, batch: PackedBatch, bucket: int | None, replay: bool, decode: bool) -> None:
        if not replay:
            self.eager += 1
            return
        assert bucket is not None  # a replayed forward has its bucket
        self.layouts[bucket].add(_layout(batch))
        if decode:
            self.decode_steps += 1
            self.decode_layouts.add(tuple(batch.seq_ids))
        if batch.positions and max(batch.positions) >= self.ladder[-1]:
            self.beyond += 1

    def result(self, repeat_identical: bool | None = None) -> SuiteCoverage:
        hit = set(self.layouts)
        regions = ladder_regions(self.ladder)
        return SuiteCoverage(
            buckets=len(self.ladder), buckets_hit=len(hit), largest_bucket_hit=self.ladder[-1] in hit,
            regions=len(regions), regions_hit=sum(1 for r in regions if hit & set(r)),
            layouts={b: len(v) for b, v in sorted(self.layouts.items())},
            decode_steps=self.decode_steps, decode_layouts=len(self.decode_layouts),
            beyond_ladder_forwards=self.beyond, eager_forwards=self.eager, repeat_identical=repeat_identical,
        )
