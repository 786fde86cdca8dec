"""CellSpec: everything one cell needs to run, as plain fields, so it crosses to the worker process as JSON."""

from __future__ import annotations

from dataclasses import dataclass

from harness.cards import find_card
from pcg_core.quant.schemes import registry as quant_registry


# The largest bucket where none is given: the GPU's ladder, and on a CPU the smoke matrix's (a tiny model there
# spends minutes in a 4096-token ladder, and latency runs to 2048 tokens say nothing on a host). Here, not in the
# command line, so a cell built without one (a repro command of a cell that died before reporting) is the same cell
# whichever way it was built.
GPU_MAX_TOKENS, CPU_MAX_TOKENS = 4096, 64


@dataclass
class CellSpec:
    model: str  # model-card id, hub id, local model directory or config.json
    graph: str = "piecewise"  # capture backend of the candidate
    attention: str = "sdpa"
    device: str = "cpu"
    dtype: str | None = None  # default: float32 on cpu, bfloat16 on cuda
    layers: int | None = None  # keep the first N decoder layers
    tiny: bool = False  # CPU-sized widths
    weights: str = "auto"  # auto | real | synthetic
    peaked: bool = True  # synthetic weights with a peaked next-token distribution (pcg_core.model.loader.peak_logits)
    max_tokens: int | None = None  # largest token bucket; default GPU_MAX_TOKENS on cuda, CPU_MAX_TOKENS on cpu
    compiler: str = "eager"
    quant: str = "none"  # quantization scheme; run_cell ends a scheme the runtime lacks as unsupported
    parallel: str = "tp1"  # parallel mode; likewise
    engine: str = "pcg"  # the runtime under test: pcg's engine, or an SGLang server (harness/sglang/)
    kv_cache: str = "auto"  # what the KV cache stores: auto (the model's dtype) or fp8_e4m3 (pcg_core.known)
    seed: int = 0
    max_new_tokens: int = 8
    top_k: int = 5
    logprob_tol: float | None = None  # None: the judge's per-dtype default
    latency_repeat: int | None = None  # None: 20 on a GPU, 5 on a CPU
    memory_share: float = 0.10  # the graph pool's share of the KV cache's room past which the verdict says so

    def __post_init__(self) -> None:
        self.quant = quant_registry.canonical(self.quant)  # an alias (fp4) runs as its scheme (nvfp4)
        if self.dtype is None:
            self.dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        if self.max_tokens is None:
            self.max_tokens = GPU_MAX_TOKENS if self.device.startswith("cuda") else CPU_MAX_TOKENS

    # The two defaults as __post_init__ resolved them (the fields stay Optional: None asks for the default).
    @property
    def resolved_dtype(self) -> str:
        assert self.dtype is not None
        return self.dtype

    @property
    def resolved_max_tokens(self) -> int:
        assert self.max_tokens is not None
        return self.max_tokens


def resolve_model(spec: CellSpec) -> str | dict:
    """A card id becomes its real config (synthetic weights), or with weights="real" the hub id of its checkpoint
    in the cell's quantization (the card's `quantized:`; _check_runtime stopped a cell that has none)."""
    card = find_card(spec.model)
    if card is None:
        return spec.model
    return (card.checkpoint_for(spec.quant) or card.hub_id) if spec.weights == "real" else card.config
