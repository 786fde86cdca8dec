"""`--write-card`: a model card (harness/models/<id>.yaml) and its config (configs/<org>__<name>.json) from a request.

The card is in the format harness/cards.py reads — id, hub_id, architecture, config, features, variants — and
is read back through it before the command reports success, so `load_cards()` picks it up. Card features are
the request's features plus the checkpoint's quantization method (fp8, mxfp4 …), as the model cards in harness/models/ list them.
An existing card, a card for the same hub id, or a different config under the same file name is never
overwritten without force.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from harness.cards import CARDS_DIR, DEFAULT_VARIANTS, find_card
from pcg_core.errors import ConfigError

_ORG_NAME_FILE = re.compile(r"^(?P<org>[A-Za-z0-9][A-Za-z0-9_.-]*?)__(?P<name>[A-Za-z0-9_.-]+)\.json$")


def card_id_for(hub_id: str) -> str:
    """The card id for a hub id: its name, lowercase ("Qwen/Qwen3-0.6B" → "qwen3-0.6b")."""
    name = hub_id.rsplit("/", 1)[-1].lower()
    card_id = re.sub(r"[^a-z0-9._-]+", "-", name).strip("-.")
    if not card_id:
        raise ConfigError(f"hub id {hub_id!r} gives no usable card id; request it by a hub id of the form org/name")
    return card_id


def config_file_for(hub_id: str) -> str:
    org, _, name = hub_id.partition("/")
    return f"{org}__{name}.json"


def hub_id_for_local(path: Path, config: dict[str, Any]) -> str | None:
    """A local request's hub id, where it can be told: a file named <org>__<name>.json (the shipped configs'
    convention), or the config's own _name_or_path when that is an org/name."""
    m = _ORG_NAME_FILE.match(path.name)
    if m:
        return f"{m['org']}/{m['name']}"
    name = config.get("_name_or_path")
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+", name):
        return name
    return None


def card_features(report: dict[str, Any]) -> list[str]:
    quant = report.get("quantization")
    return list(report["features"]) + ([quant["method"]] if quant else [])


def existing_cards(models_dir: Path) -> dict[str, tuple[str, Path]]:
    """hub_id → (card id, card file), read leniently (a broken card elsewhere must not block this request)."""
    out: dict[str, tuple[str, Path]] = {}
    for p in sorted(models_dir.glob("*.yaml")):
        try:
            data = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and isinstance(data.get("hub_id"), str):
            out[data["hub_id"]] = (str(data.get("id") or p.stem), p)
    return out


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def card_yaml(card: dict[str, Any], report: dict[str, Any]) -> str:
    status = "supported by the runtime" if report["supported"] else "not supported by the runtime yet"
    size = f", {report['params'] / 1e9:.1f}B params" if report.get("params") else ""
    head = f"# Written by `pcgh request` ({status}{size}; config hash {report['config_hash'][:12]}).\n"
    return head + yaml.safe_dump(card, sort_keys=False, default_flow_style=None, width=200)


def check_card(config: dict[str, Any], hub_id: str, *, models_dir: Path | str = CARDS_DIR, force: bool = False) -> None:
    """Refuse what write_card would refuse (a ConfigError), writing nothing: `pcgh request` asks before it records."""
    models_dir = Path(models_dir)
    if not models_dir.is_dir():
        raise ConfigError(f"models directory {models_dir} does not exist; pass an existing folder of model cards")
    path = models_dir / f"{card_id_for(hub_id)}.yaml"
    config_path = models_dir / "configs" / config_file_for(hub_id)
    if not force:
        if path.exists():
            raise ConfigError(f"card {path} already exists; pass --force to overwrite it")
        other = existing_cards(models_dir).get(hub_id)
        if other is not None:
            raise ConfigError(f"card {other[1]} already covers hub id {hub_id}; pass --force to write {path.name} as well")
        if config_path.exists():
            try:
                same = json.loads(config_path.read_text()) == config
            except (OSError, json.JSONDecodeError):
                same = False
            if not same:
                raise ConfigError(f"{config_path} already exists with a different config; pass --force to overwrite it")


def write_card(report: dict[str, Any], config: dict[str, Any], hub_id: str, *, models_dir: Path | str = CARDS_DIR,
               force: bool = False) -> dict[str, Any]:
    """Write the card and its config into `models_dir`; {"id", "path", "config_path"} of what was written."""
    check_card(config, hub_id, models_dir=models_dir, force=force)
    models_dir = Path(models_dir)
    card_id = card_id_for(hub_id)
    path = models_dir / f"{card_id}.yaml"
    config_rel = f"configs/{config_file_for(hub_id)}"
    config_path = models_dir / config_rel
    card: dict[str, Any] = {"id": card_id, "hub_id": hub_id, "architecture": report["architecture"], "config": config_rel}
    if report.get("revision"):
        card["revision"] = report["revision"]
    card["features"] = card_features(report)
    card["variants"] = list(DEFAULT_VARIANTS)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    _write(config_path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    _write(path, card_yaml(card, report))
    loaded = find_card(card_id, models_dir)  # read back the way the harness reads cards
    if loaded is None or loaded.config != config or loaded.hub_id != hub_id:
        raise ConfigError(f"card {path} was written but does not read back as written; check {models_dir}")
    return {"id": card_id, "path": str(path), "config_path": str(config_path)}
