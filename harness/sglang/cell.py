"""One SGLang cell: the reference server (prefill graphs disabled) runs the prompt suite twice, the candidate (the
cell's prefill backend) once, each case's graph passes counted by the candidate itself; judge.py decides.

The servers run one after the other on the cell's GPUs, each torn down before the next starts (server.py). The
model folder holds the card's config, trimmed or shrunk as the cell asks, which both servers load with the same
seeded dummy weights; a real checkpoint (`full`) is served from its own folder.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import httpx

from harness.cards import find_card
from harness.cell.judge.tolerances import LOGPROB_TOL
from harness.cell.prompts import Case, prompt_suite
from harness.cell.spec import CellSpec
from harness.metrics import CellMetrics
from harness.outcome import CellOutcome, Status
from harness.sglang.client import GraphPasses, SGLangClient
from harness.sglang.flags import server_flags
from harness.sglang.judge import judge_sglang
from harness.sglang.server import ServerDied, launch_command, running_server
from pcg_core.config import CaptureConfig
from pcg_core.engine import SequenceOutput
from pcg_core.model.loader import shrink_config

Outputs = dict[str, list[SequenceOutput]]
# A server that died, never became healthy, broke a connection, answered an error or something not SGLang's API
SERVER_ERRORS = (ServerDied, TimeoutError, OSError, httpx.HTTPError, ValueError)
# Synthetic weights in these schemes need the checkpoint's quantization_config in the config SGLang reads.
QUANT_CONFIGS: dict[str, dict | None] = {
    "none": None,
    "fp8_block": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
}


def model_folder(spec: CellSpec, root: Path) -> Path:
    """A folder with the cell's config.json: the card's, trimmed to `layers` or shrunk (tiny), with the scheme's
    quantization_config. ValueError for a scheme whose config is not written here yet."""
    card = find_card(spec.model)
    if card is None:
        raise ValueError(f"no model card {spec.model!r}: an SGLang cell serves a card's config")
    if spec.quant not in QUANT_CONFIGS:
        raise ValueError(f"no synthetic {spec.quant} checkpoint config for SGLang yet (written: {', '.join(QUANT_CONFIGS)})")
    config = shrink_config(card.config, layers=spec.layers, tiny=spec.tiny)
    if (quant := QUANT_CONFIGS[spec.quant]) is not None:
        config["quantization_config"] = quant
    folder = root / "model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _suite(spec: CellSpec, config: dict) -> tuple[list[Case], int]:
    ladder = CaptureConfig(max_tokens=spec.resolved_max_tokens).ladder
    text = config.get("text_config", config)
    cases = prompt_suite(ladder, int(text["vocab_size"]), seed=spec.seed, max_new_tokens=spec.max_new_tokens)
    return [c for c in cases if c.images is None and c.join_at is None], ladder[-1]


def _run_suite(client: SGLangClient, cases: list[Case], top_k: int,
               passes: dict[str, GraphPasses] | None = None) -> Outputs:
    """Each case's rounds as requests in order (a later round reuses what the server cached of an earlier one);
    `passes`, when given, gets each case's prefill forwards by how they ran."""
    out: Outputs = {}
    client.flush_cache()
    for case in cases:
        before = client.graph_passes() if passes is not None else GraphPasses()
        got: list[SequenceOutput] = []
        for prompts, new, _, _ in case.round_parts():
            outs: list[SequenceOutput | None] = [None] * len(prompts)
            for n in sorted(set(new)):  # one request per decode length (sampling params are per request)
                idx = [i for i, k in enumerate(new) if k == n]
                for i, o in zip(idx, client.generate([prompts[i] for i in idx], n, top_k)):
                    outs[i] = o
            got += [o for o in outs if o is not None]
        out[case.name] = got
        if passes is not None:
            passes[case.name] = client.graph_passes().since(before)
    return out


def run_sglang_cell(spec: CellSpec, workdir: Path, health_timeout_s: float = 900.0,
                    command: Sequence[str] | None = None) -> CellOutcome:
    """The cell's outcome. `command`: what serves launch_server's flags (pcg's own server in the CPU tests)."""
    from harness.cell.run import recorded_settings

    t0 = time.perf_counter()
    command = launch_command() if command is None else command
    metrics = recorded_settings(spec)
    try:
        folder = model_folder(spec, workdir)
    except ValueError as e:
        return CellOutcome(status=Status.UNSUPPORTED, reason=str(e), metrics=metrics)
    cases, largest = _suite(spec, json.loads((folder / "config.json").read_text()))
    tol = spec.logprob_tol if spec.logprob_tol is not None else LOGPROB_TOL[spec.resolved_dtype]

    def serve(graphs: bool):
        port = free_port()
        flags = server_flags(spec, folder, port, graphs)
        print(f"PCG-SGLANG {'candidate' if graphs else 'reference'}: {' '.join([*command, *flags])}", flush=True)
        return running_server(flags, port, workdir / f"{'candidate' if graphs else 'reference'}.log", health_timeout_s,
                              command)

    try:
        with serve(False) as server:
            ref, ref_again = _run_suite(server, cases, spec.top_k), _run_suite(server, cases, spec.top_k)
    except SERVER_ERRORS as e:
        return _ended(Status.EAGER_FAIL, f"the reference server (prefill graphs disabled): {e}", metrics, t0)
    passes: dict[str, GraphPasses] = {}
    try:
        with serve(True) as server:
            cand = _run_suite(server, cases, spec.top_k, passes)
    except SERVER_ERRORS as e:
        return _ended(Status.FAIL_CAPTURE, f"the candidate server (prefill {spec.graph}): {e}", metrics, t0)
    status, reason, judgement = judge_sglang(cases, ref, ref_again, cand, passes, largest, tol)
    for name, value in asdict(judgement).items():
        if name not in ("status", "reason", "failed_cases") and hasattr(metrics.judge, name):
            setattr(metrics.judge, name, value)
    return _ended(status, reason, metrics, t0)


def _ended(status: Status, reason: str, metrics: CellMetrics, t0: float) -> CellOutcome:
    return CellOutcome(status=status, reason=reason[:2000], metrics=metrics, duration_s=round(time.perf_counter() - t0, 3))
