"""`pcgh request`: read the config, analyze it, find earlier requests, write the card, record, submit.

Every failure of the user's input is a ConfigError (exit code 2) raised before anything is written, except
a failing --submit, which comes after the request is recorded locally (its message says so). The queue keeps one
row per model (Store.queue_request): asking again refreshes that row's analysis and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.cards import CARDS_DIR
from harness.request.analyze import analyze
from harness.request.card_writer import (
    check_card,
    existing_cards,
    hub_id_for_local,
    write_card,
)
from harness.request.quantization import check_quant_words
from harness.store.rows import RequestRow
from harness.request.source import looks_like_hub_id, resolve
from harness.request.submit import endpoint, submit, token
from pcg_core.errors import ConfigError


def _summary(row: RequestRow) -> dict[str, Any]:
    keys = ("id", "model", "revision", "architecture", "supported", "status", "card_id", "match")
    out = {k: getattr(row, k) for k in keys}
    out["created_at"] = row.created_at.isoformat()
    return out


def request_model(model: str, *, revision: str | None = None, quants: list[str] | None = None, tps: list[int] | None = None,
                  db: str | None = None, write: bool = False, force: bool = False, models_dir: Path | str = CARDS_DIR,
                  submit_url: str | None = None, hub_id: str | None = None) -> dict[str, Any]:
    """The whole request; returns the report with request_id, requested_before, duplicates, card_id, card and
    submitted filled in. `hub_id`: the hub id of a local config (else told by its file name, <org>__<name>.json)."""
    from harness.store import Store

    quants = check_quant_words(quants or []) or None
    if tps and any(t <= 0 for t in tps):
        raise ConfigError(f"--tp takes positive integers, got {tps}")
    if hub_id is not None and not looks_like_hub_id(hub_id):
        raise ConfigError(f"--hub-id {hub_id!r} is not a hub id; pass one of the form org/name, e.g. Qwen/Qwen3-8B")
    if hub_id not in (None, model) and not Path(model).expanduser().exists() and looks_like_hub_id(model):
        raise ConfigError(f"--hub-id {hub_id} is another model than {model}; --hub-id names the model of a local "
                          "config.json or directory, a hub id names itself (drop --hub-id)")
    if submit_url is not None:  # fail before any work when the submission could never succeed
        endpoint(submit_url)
        token()
    source = resolve(model, revision)
    hub_id = hub_id or source.hub_id or hub_id_for_local(source.path, source.config)
    if write:  # refused before the store is opened (or made): no hub id, or a card or config in the way
        if hub_id is None:
            raise ConfigError(f"--write-card needs the model's hub id for the card's hub_id, and {source.model} does not "
                              "tell it; pass --hub-id ORG/NAME (or name the file <org>__<name>.json)")
        check_card(source.config, hub_id, models_dir=models_dir, force=force)
    report = analyze(source.config, model=source.model, source=source.kind, revision=source.revision, quants=quants, tps=tps)
    report["hub_id"] = hub_id
    existing = existing_cards(Path(models_dir)).get(hub_id) if hub_id and Path(models_dir).is_dir() else None
    card_id = existing[0] if existing is not None else None
    with Store(db) as store:
        dups = store.duplicate_requests(source.model if source.kind == "hub" else None, source.revision, report["config_hash"])
        report["card"] = None
        if write:
            assert hub_id is not None  # refused above without one
            report["card"] = write_card(report, source.config, hub_id, models_dir=models_dir, force=force)
            card_id = report["card"]["id"]
        report["card_id"] = card_id
        request_id, new = store.queue_request({
            "model": source.model, "revision": source.revision, "config_hash": report["config_hash"],
            "architecture": report["architecture"], "supported": report["supported"], "verdict": dict(report),
            "status": "requested", "card_id": card_id,
        }, config=source.config, same_config=source.kind != "hub")
        report["request_id"], report["requested_before"] = request_id, not new
        report["duplicates"] = [_summary(r) for r in dups if r.id != request_id]  # other rows: hints, not this one
    report["submitted"] = None
    if submit_url is not None:
        try:
            report["submitted"] = submit(submit_url, {**report, "config": source.config})
        except ConfigError as e:
            raise ConfigError(f"{e} (the request is recorded locally as #{report['request_id']})") from e
    return report
