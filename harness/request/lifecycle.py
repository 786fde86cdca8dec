"""A model request's way through the nightly: its card joins the nightly's model axis, and the nightly's cells of
that card move the request to passing, failing or unsupported, with the reason kept beside it.

Only requests with a card can run (the card is what a matrix names): written by `pcgh request --write-card`,
linked when a card for the hub id exists, or, for a request accepted on the dashboard, written here by the nightly
from the config the request kept (into the cards folder of the checkout the nightly runs from). The others wait as
`requested`. A request is judged again every nightly, so a model that breaks later shows it. Requests of the same
card share its cells, and a card the matrix runs already is judged by the matrix's own cells of it (no second size
of the same model). A sharded nightly judges a request by the cells of its card in each shard's run, the last
shard to finish having the last word.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.cards import CARDS_DIR, find_card
from harness.outcome import PASSING, VARIANT_GRAMMAR, CellRecord, ModelRef
from harness.reports.stats import is_failing
from harness.request.card_writer import existing_cards, write_card
from harness.store.rows import RequestRow
from harness.store import Store
from pcg_core.errors import ConfigError


@dataclass
class Joined:
    """The requests a nightly runs: request id → its model axis values, and the requests left out with why."""

    requests: dict[int, list[str]] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)

    @property
    def models(self) -> list[str]:
        """Every model axis value of a joined request, once, in the order they asked."""
        return list(dict.fromkeys(m for ms in self.requests.values() for m in ms))


def join_requests(store: Store, variant: str, present: Sequence[str] = (), cards_dir: Path = CARDS_DIR) -> Joined:
    """Every request with a card: judged by the card's cells already in the matrix (`present`, its model axis),
    else by the card at `variant` added to it. A card that is gone, does not load or does not offer the variant
    leaves its requests out (with why: the nightly prints it), never the night."""
    try:
        ModelRef.parse(f"card:{variant}")
    except ValueError as e:
        raise ConfigError(f"requested models' variant {variant!r} (--requests or nightly.requests) is not one of "
                          f"{VARIANT_GRAMMAR}") from e
    in_matrix: dict[str, list[str]] = {}
    for value in present:
        in_matrix.setdefault(ModelRef.parse(value).card, []).append(value)
    joined = Joined()
    for req in reversed(store.requests()):  # oldest first: the order they asked in
        card_id = req.card_id
        if not card_id and req.status == "accepted":
            try:
                card_id = _card_for_accepted(store, req, cards_dir)
            except ConfigError as e:
                joined.left_out[req.id] = f"accepted, but its card cannot be written: {e}"
                continue
        if not card_id:
            continue
        if card_id in in_matrix:
            joined.requests[req.id] = in_matrix[card_id]
            continue
        try:
            card = find_card(card_id, cards_dir)
        except ConfigError as e:
            joined.left_out[req.id] = f"card {card_id} does not load: {e}"
            continue
        if card is None:
            joined.left_out[req.id] = f"card {card_id} is not in {cards_dir}"
        elif variant.partition(":")[0] not in card.variants:
            joined.left_out[req.id] = f"card {card.id} offers {', '.join(card.variants)}, not {variant}"
        else:
            joined.requests[req.id] = [f"{card.id}:{variant}"]
    return joined


def _card_for_accepted(store: Store, req: RequestRow, cards_dir: Path) -> str:
    """An accepted request's card: the one that covers its hub id already, else one written from the config the
    request kept (card_writer, as `pcgh request --write-card` writes it); linked to the request either way."""
    verdict = req.verdict or {}
    hub_id = verdict.get("hub_id") or (req.model if verdict.get("source") == "hub" else None)
    if not hub_id:
        raise ConfigError(f"request #{req.id} ({req.model}) does not tell its hub id; request it by its hub id")
    existing = existing_cards(cards_dir).get(hub_id)
    if existing is not None:
        card_id = existing[0]
    else:
        config = store.request_config(req.id)
        if config is None:
            raise ConfigError(f"request #{req.id} kept no config.json to write a card from; ask again with "
                              "`pcgh request MODEL --submit URL` (or --write-card)")
        card_id = write_card(verdict, config, hub_id, models_dir=cards_dir)["id"]
    store.set_request_status(req.id, "accepted", card_id=card_id)
    return card_id


def mark_in_matrix(store: Store, joined: Joined) -> None:
    for request_id in joined.requests:
        store.set_request_status(request_id, "in_matrix")


def judge(records: list[CellRecord]) -> tuple[str, str, dict[str, int]] | None:
    """(status, reason, counts) of one card's cells in a run; None when the run has none of them (a shard or a
    filter left them to another run)."""
    if not records:
        return None
    counts: Counter[str] = Counter(r.status for r in records)
    # eager_fail is not the graph's fault (not counted in a pass rate) but the model does not run: failing here
    failing = [r for r in records if is_failing(r.status) or r.status == "eager_fail"]
    passing = sum(counts[s] for s in PASSING)
    n = len(records)
    if failing:
        first = failing[0]
        why = f"{len(failing)} of {n} cells fail; first: {first.key}: {first.status}" + (f": {first.reason}" if first.reason else "")
        return "failing", why, dict(counts)
    if passing:
        rest = n - passing
        return "passing", f"{passing} of {n} cells pass" + (f" ({rest} unsupported or skipped)" if rest else ""), dict(counts)
    reasons = Counter(r.reason for r in records if r.reason)
    why = reasons.most_common(1)[0][0] if reasons else "no cell ran"
    return "unsupported", f"none of its {n} cell(s) runs: {why}", dict(counts)


def record_outcomes(store: Store, run_id: int, joined: Joined, records: list[CellRecord]) -> dict[int, tuple[str, str]]:
    """Move each joined request by its card's cells in this run; request id → (status, reason) of those moved."""
    by_model: dict[str, list[CellRecord]] = {}
    for r in records:
        by_model.setdefault(str(r.axes.get("model")), []).append(r)
    moved = {}
    for request_id, models in joined.requests.items():
        verdict = judge([r for m in models for r in by_model.get(m, [])])
        if verdict is None:
            continue
        status, reason, counts = verdict
        store.record_request_outcome(request_id, run_id, status, reason, counts)
        moved[request_id] = (status, reason)
    return moved
