"""A model's shape from its raw config.json alone: the fields it names (fields.py), its widths, per-layer attention
kinds and MoE numbers (structure.py), and its parameter count and memory (params.py).

Below both the matrix (the pre-check's memory fit) and `pcgh request` (the what-if report), which read it; it reads
only the config and pcg_core's errors.
"""
