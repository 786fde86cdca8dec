"""Model cards (harness/models/*.yaml): which model, which real config, which features it exercises, and which
quantized checkpoints of it exist (`quantized: {scheme: hub id}`), so a real-weights cell of a scheme loads the
checkpoint published in it rather than quantizing anything itself."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.safe_yaml import compose_and_load
from pcg_core.errors import ConfigError
from pcg_core.known import KNOWN_QUANTIZATION
from pcg_core.quant.schemes import registry as quant_registry
from pcg_core.model.config_file import read_config_file

CARDS_DIR = Path(__file__).parent / "models"
# full: real weights from the hub; trim: real widths, N layers (trim:N), synthetic weights; tiny: CPU-sized.
DEFAULT_VARIANTS = ("full", "trim", "tiny")
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass
class ModelCard:
    id: str
    hub_id: str
    architecture: str
    config: dict[str, Any]
    features: list[str] = field(default_factory=list)
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    path: Path | None = None
    quantized: dict[str, str] = field(default_factory=dict)  # scheme → hub id of a checkpoint published in it

    def checkpoint_for(self, quant: str) -> str | None:
        """The hub id real weights of `quant` load from: the card's own for "none", else the declared one."""
        return self.hub_id if quant == "none" else self.quantized.get(quant)

    def no_checkpoint_reason(self, quant: str) -> str | None:
        if self.checkpoint_for(quant) is not None:
            return None
        have = ", ".join(f"{k} ({v})" for k, v in self.quantized.items()) or "none"
        return (f"card {self.id} declares no {quant} checkpoint for real weights (it declares: {have}); add one under "
                f"`quantized:` in {self.path.name if self.path else 'its card'}")

    def checkpoint_config(self, quant: str) -> dict[str, Any] | None:
        """The config.json of the checkpoint the card declares for `quant`, where the repository holds it: the
        card's own config for its own hub id, else configs/<org>__<name>.json beside the card; None otherwise."""
        hub = self.checkpoint_for(quant)
        if hub is None:
            return None
        if hub == self.hub_id:
            return self.config
        vendored = (self.path.parent if self.path else CARDS_DIR) / "configs" / f"{hub.replace('/', '__', 1)}.json"
        return read_config_file(vendored) if vendored.is_file() else None

    def checkpoint_reason(self, quant: str) -> str | None:
        """Why pcg's loader would not read the checkpoint the card declares for `quant` as that scheme (its
        quantization_config refused, or read as another scheme), or None; None too where the repository does not
        hold that checkpoint's config. The loader's own reader decides (pcg_core.quant.detect), so a card cannot
        promise a checkpoint the runtime refuses. Imports the quantization code (torch): call it lazily."""
        config = self.checkpoint_config(quant)
        if config is None or quant == "none":
            return None
        from pcg_core.errors import UnsupportedModel
        from pcg_core.quant import detect

        hub, where = self.checkpoint_for(quant), self.path.name if self.path else f"card {self.id}"
        try:
            spec = detect(config)
        except UnsupportedModel as e:
            return f"{where}: quantized.{quant} names {hub}, whose quantization_config pcg does not read: {e}"
        got = spec.scheme.name if spec is not None else "none"
        if got != quant:
            return (f"{where}: quantized.{quant} names {hub}, whose quantization_config pcg reads as {got}, not {quant}; "
                    f"declare it as `{got}: {hub}` under `quantized:`")
        return None

    @property
    def architecture_reason(self) -> str | None:
        """Why the runtime's architecture table lacks this card's architecture (its config's `architectures[0]`,
        else the card's own `architecture`), or None. The table alone, without torch or transformers: what `pcgh
        models` shows (runtime_reason also has transformers build the config, seconds of imports)."""
        from pcg_core.model.architectures import architecture_reason

        archs = self.config.get("architectures")
        named = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else self.architecture
        return architecture_reason(named)

    @cached_property
    def runtime_reason(self) -> str | None:
        """Why the runtime cannot run this card's architecture, or None. Cached on the card: building the
        transformers config costs ~2 ms and a plan asks once per cell (thousands)."""
        from pcg_core.model import build_config, unsupported_reason

        try:
            return unsupported_reason(build_config(self.config, where=f"card {self.id}"))
        except ConfigError as e:
            return str(e)


def _load(path: Path) -> ModelCard:
    # The matrices' bounded reader: UTF-8 only, no duplicate keys, no alias bombs, a size cap.
    _, data = compose_and_load(path, what="model card")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a model card is a YAML mapping with id, hub_id, architecture, config")
    missing = [k for k in ("id", "hub_id", "architecture", "config") if k not in data]
    if missing:
        raise ConfigError(f"{path}: missing field(s) {', '.join(missing)}")
    config = data["config"]
    if isinstance(config, str):
        config_path = path.parent / config
        if not config_path.is_file():
            raise ConfigError(f"{path}: field config names {config!r}, which is not a file beside the card")
        config = read_config_file(config_path)  # its errors name the file and the JSON problem
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: field config must be a file name or an inline mapping")
    variants = list(data.get("variants") or DEFAULT_VARIANTS)
    bad = [v for v in variants if v not in DEFAULT_VARIANTS]
    if bad:
        raise ConfigError(f"{path}: unknown variant(s) {bad}; allowed: {', '.join(DEFAULT_VARIANTS)}")
    return ModelCard(data["id"], data["hub_id"], data["architecture"], config, list(data.get("features") or []), variants, path,
                     _quantized(path, data.get("quantized")))


def _quantized(path: Path, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: field quantized maps a scheme to a hub id, e.g. {{fp8_block: Qwen/Qwen3-8B-FP8}}")
    schemes = [q for q in KNOWN_QUANTIZATION if q != "none"]
    for scheme, hub_id in value.items():
        if scheme not in schemes:
            raise ConfigError(f"{path}: quantized: unknown scheme {scheme!r}; known: {', '.join(schemes)}")
        if not isinstance(hub_id, str) or not _HUB_ID.match(hub_id):
            raise ConfigError(f"{path}: quantized.{scheme}: {hub_id!r} is not a hub id of the form org/name")
    return {quant_registry.canonical(scheme): hub_id for scheme, hub_id in value.items()}  # fp4: nvfp4


def load_cards(directory: Path = CARDS_DIR) -> dict[str, ModelCard]:
    cards: dict[str, ModelCard] = {}
    for path in sorted(directory.glob("*.yaml")):
        card = _load(path)
        if card.id in cards:
            raise ConfigError(f"{path}: card id {card.id!r} is already used by {cards[card.id].path}")
        cards[card.id] = card
    return cards


def find_card(model_id: str, directory: Path = CARDS_DIR) -> ModelCard | None:
    path = directory / f"{model_id}.yaml"
    return _load(path) if path.is_file() else None
