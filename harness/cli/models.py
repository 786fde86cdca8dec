"""`pcgh models`, `request` and `requests`: which models the harness knows, and the models users ask for."""

from __future__ import annotations

import argparse
import json
from typing import Any

from harness.cli.args import add_db, positive_int
from pcg_core.errors import ConfigError

EXIT_PASS = 0


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the model cards and whether the runtime's architecture table has them",
                       description="List the model cards (harness/models/) and whether the runtime's architecture table "
                                   "has each one's architecture. Reads the table alone, without loading torch or "
                                   "transformers; `pcgh request CONFIG` checks a config in full.")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.set_defaults(handler=models)

    p = sub.add_parser("request", help="analyze a model from its config.json alone and record the request")
    p.add_argument("model", metavar="MODEL", help="hub id (org/name), local model directory or config.json")
    p.add_argument("--revision", help="hub revision (branch, tag or commit) of a hub id")
    p.add_argument("--quant", nargs="+", action="extend", metavar="Q", help="quantization scheme(s) to ask for (default: the checkpoint's)")
    p.add_argument("--tp", nargs="+", action="extend", type=positive_int, metavar="N",
                   help="TP size(s) to check the model against, a what-if: whether each divides the heads and holds the "
                        "bf16 weights, and whether the runtime runs it yet (default: the smallest that holds them)")
    p.add_argument("--submit", metavar="URL", help="also POST the request to URL/api/requests (token: $PCG_UPLOAD_TOKEN)")
    p.add_argument("--write-card", action="store_true",
                   help="write harness/models/<id>.yaml and its config; needs the hub id: a hub id MODEL, a file named "
                        "<org>__<name>.json, or --hub-id")
    p.add_argument("--hub-id", metavar="ORG/NAME", help="the hub id of a local config.json or model directory (for --write-card "
                                                        "and to link an existing card)")
    p.add_argument("--force", action="store_true", help="with --write-card: overwrite an existing card or config")
    p.add_argument("--models-dir", help="the model-card folder --write-card writes into (default: harness/models)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_db(p)
    p.set_defaults(handler=request)

    p = sub.add_parser("requests", help="list the recorded model requests, newest first")
    add_db(p)
    p.add_argument("--status", help="only requests in this status (requested, in_matrix, passing, failing)")
    p.add_argument("--limit", type=positive_int)
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.set_defaults(handler=requests)


def models(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harness.cards import load_cards

    rows: list[dict[str, Any]] = []
    for card in load_cards().values():
        reason = card.architecture_reason  # torch-free: listing cards must not load the runtime (10 s)
        rows.append({"id": card.id, "hub_id": card.hub_id, "architecture": card.architecture,
                     "features": list(card.features), "runtime": "supported" if reason is None else reason})
    if args.json:
        print(json.dumps(rows))
        return EXIT_PASS
    t = Table("id", "hub id", "architecture", "features", "runtime")
    for r in rows:
        t.add_row(r["id"], r["hub_id"], r["architecture"], ", ".join(r["features"]), r["runtime"])
    console = Console()
    if not console.is_terminal:  # a pipe or a file: no terminal width to fit, so nothing is cut
        console = Console(width=max(200, max((len(r["id"]) + len(r["hub_id"]) for r in rows), default=0) + 120))
    t.columns[0].no_wrap = t.columns[1].no_wrap = True  # ids are what a user copies: never cut or folded
    console.print(t)
    return EXIT_PASS


def request(args: argparse.Namespace) -> int:
    from harness.cards import CARDS_DIR
    from harness.request.command import request_model
    from harness.request.render import print_request

    report = request_model(args.model, revision=args.revision, quants=args.quant, tps=args.tp, db=args.db,
                           write=args.write_card, force=args.force, models_dir=args.models_dir or CARDS_DIR,
                           submit_url=args.submit, hub_id=args.hub_id)
    if args.json:
        print(json.dumps(report))
    else:
        print_request(report)
    return EXIT_PASS


def requests(args: argparse.Namespace) -> int:
    from harness.request.render import print_requests
    from harness.store import Store
    from harness.store.models import REQUEST_STATUSES

    if args.status is not None and args.status not in REQUEST_STATUSES:
        raise ConfigError(f"--status {args.status!r} is not a request status; use one of {', '.join(REQUEST_STATUSES)}")
    with Store(args.db, read_only=True) as store:  # a missing database is an error, as for report (a typo'd --db)
        rows = store.requests(limit=args.limit, status=args.status)
    if args.json:
        print(json.dumps([r.model_dump(mode="json", exclude={"match"}) for r in rows]))  # `match`: duplicates' only
    else:
        print_requests(rows)
    return EXIT_PASS
