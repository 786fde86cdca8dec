"""The request report: what `pcgh request --json` prints, `--submit` POSTs and the store keeps.

A pydantic model, so a consumer (the dashboard's POST /api/requests) can validate a body with
`RequestReport.model_validate(data)`. Fields the command adds after the analysis (request_id, duplicates,
card, submitted) are optional; unknown fields are kept, so an older reader accepts a newer report.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
VERDICT_AXES = ("model", "quant", "attention", "parallel", "graph", "kv_cache")


class Verdict(BaseModel):
    ok: bool
    reason: str


class RequestReport(BaseModel):
    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    model: str  # hub id, or the local path the config was read from
    source: Literal["hub", "local", "config"]
    revision: str | None = None
    config_hash: str
    model_type: str | None = None
    architecture: str
    supported: bool
    reason: str | None = None  # why the runtime cannot run it; None when supported
    features: list[str]
    feature_details: dict[str, dict[str, Any]] = {}
    quantization: dict[str, Any] | None = None
    dtype: str | None = None
    params: int | None = None
    active_params: int | None = None
    non_embedding_params: int | None = None
    param_breakdown: dict[str, int] = {}
    memory_bytes: dict[str, int] = {}
    h200s: int | None = None
    # The prefill graphs' estimated pool per GPU and the context it costs (harness/request/graph_memory.py).
    graph_memory: dict[str, Any] | None = None
    tp_sizes: list[int]
    ep_sizes: list[int] = []
    requested: dict[str, Any] = {}
    verdicts: dict[str, Verdict]
    notes: list[str] = []
    # Added by the command after the analysis.
    hub_id: str | None = None  # the hub id, also for a local config whose file name or _name_or_path tells it
    request_id: int | None = None
    requested_before: bool = False  # request_id is the model's row queued earlier, refreshed, not a new one
    duplicates: list[dict[str, Any]] = []
    card_id: str | None = None
    card: dict[str, Any] | None = None
    submitted: dict[str, Any] | None = None


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the config as canonical JSON (sorted keys, no spaces): equal configs hash equal, whatever the
    file's formatting or key order."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
