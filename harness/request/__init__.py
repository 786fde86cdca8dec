"""Contributor model requests (`pcgh request MODEL`): what the runtime would make of a model, from its config.json alone.

- source.py       MODEL (hub id, directory, config.json) → the raw config, fetched alone, never run
- harness/shape/  widths, per-layer attention kind, MoE numbers (structure.py), parameter count, active params,
                  memory (params.py), read from the raw JSON; below the matrix, whose memory fit reads it too
- features.py     moe, mla, sliding_window, sinks, linear_attention, vlm, rope_scaling
- quantization.py the checkpoint's quantization_config → {method, params}
- verdicts.py     one verdict per matrix axis, from the runtime's capability table
- analyze.py      all of the above → the report (schema.py)
- card_writer.py  --write-card; submit.py --submit; command.py the whole command; render.py its tables

The package root imports only the report's schema, so the dashboard can validate a submitted request without
loading the analysis (which reads configs through transformers).
"""

from harness.request.schema import RequestReport

__all__ = ["RequestReport"]
