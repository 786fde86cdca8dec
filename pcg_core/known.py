"""What the project knows by name on each axis, whether or not this runtime runs it yet, and the size limits every
entry point shares.

Two questions are kept apart: is a name *known* (else it is a typo, refused when a matrix loads, with a
suggestion) and can this runtime *run* it (pcg_core.capabilities; else the cell is `unsupported`, with the
reason). Only the not-yet-implemented vocabulary lives here; what is registered (capture and attention backends)
comes from the registries at validation time. Torch-free, like pcg_core.errors, so any caller can check a name.
"""

from __future__ import annotations

import re

from pcg_core.quant.schemes import registry as quant_registry

# Fixed choices of the runtime, by name (pcg_core.config maps the dtypes to torch's).
COMPILERS: tuple[str, ...] = ("eager", "inductor")
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# What the KV cache stores: `auto` the model's dtype; `fp8_e4m3` K and V as torch.float8_e4m3fn with one scale per
# layer for K and one for V (MLA: one for the latent row), dequantized on read (pcg_core/attention/kv_cache.py).
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8_e4m3")

# Quantization: the runtime's schemes and their aliases come from the one registry (quant/schemes/registry.py,
# torch-free); beside them, the umbrella words for a checkpoint's own granularity and the checkpoint formats
# (quant_method values) `pcgh request --quant` accepts.
QUANT_UMBRELLAS: tuple[str, ...] = ("fp8", "int8", "int4")
QUANT_REQUEST_FORMATS: tuple[str, ...] = ("modelopt", "compressed-tensors", "bitsandbytes", "gguf")
KNOWN_QUANTIZATION: tuple[str, ...] = tuple(dict.fromkeys((
    "none", *QUANT_UMBRELLAS, *quant_registry.MATRIX_SCHEMES, *quant_registry.ALIASES, *QUANT_REQUEST_FORMATS)))

# Attention backends planned but not registered yet; registered ones (pcg_core.attention) are known as well.
PLANNED_ATTENTION: tuple[str, ...] = (
    "triton",  # our own paged extend/decode kernel
    "fa3",  # FlashAttention 3 (no wheel for us yet)
    "flashinfer",
)

# Parallel modes are a grammar, not a list: kinds in this order, each at most once, joined by "-" (tp2-ep8).
PARALLEL_KINDS: tuple[str, ...] = ("tp", "pp", "dp", "ep")
# The largest degree: far beyond any cluster a cell runs on; a bigger number is a typo, not a plan.
MAX_PARALLEL_DEGREE = 1024
_PART = re.compile(r"^(tp|pp|dp|ep)([1-9][0-9]{0,5})$")
PARALLEL_GRAMMAR = "parts KINDn joined by '-' (tp2, tp2-ep8), kinds tp, pp, dp, ep in that order, n ≥ 1"

# The largest token bucket any entry point accepts. The largest bucket's buffers (inputs, hidden states, MLP
# intermediates, captured graphs) are allocated up front, so 100,000,000 took 6 GB before a single cell ran;
# 2^20 covers the longest-context models we test (1M tokens) and stops a typo before it allocates.
MAX_TOKENS = 1 << 20


def parse_parallel(text: str) -> dict[str, int]:
    """{kind: degree} of a parallel mode such as "tp2-ep8"; ValueError saying what is wrong otherwise."""
    parts = []
    for part in str(text).split("-"):
        m = _PART.match(part)
        if m is None:
            raise ValueError(f"parallel mode {text!r} is not {PARALLEL_GRAMMAR}")
        parts.append((m.group(1), int(m.group(2))))
    kinds = [k for k, _ in parts]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"parallel mode {text!r} names a kind twice; {PARALLEL_GRAMMAR}")
    canonical = sorted(parts, key=lambda p: PARALLEL_KINDS.index(p[0]))
    if parts != canonical:  # one spelling per mode, so one cell key per mode
        fixed = "-".join(f"{k}{n}" for k, n in canonical)
        raise ValueError(f"parallel mode {text!r}: write it {fixed} (kinds in the order tp, pp, dp, ep)")
    for _, n in parts:
        if n > MAX_PARALLEL_DEGREE:
            raise ValueError(f"parallel mode {text!r}: degree {n} is over {MAX_PARALLEL_DEGREE}")
    return dict(parts)


def world_size(mode: str) -> int:
    """Ranks (processes; on CUDA, GPUs of one host) a cell of parallel mode `mode` runs as: pp × max(tp·dp, ep).

    TP and DP ranks hold the attention; EP spreads the experts over those ranks (ep dividing tp·dp: tp2-ep2), or,
    where it is the larger (ep8, tp2-ep8), sets the rank count itself, the attention replicated over the extra
    ranks as data-parallel groups (vLLM's EP = TP × DP). PP multiplies it all by its stages. ValueError when the
    two do not nest, so a cell cannot ask for a layout no rank count gives."""
    d = parse_parallel(mode)
    tp, pp, dp, ep = (d.get(k, 1) for k in ("tp", "pp", "dp", "ep"))
    attention = tp * dp
    small, large = sorted((attention, ep))
    if large % small:
        raise ValueError(f"parallel mode {mode!r}: ep{ep} and tp·dp = {attention} do not nest (one must divide the "
                         f"other: the experts are spread over the attention ranks); write e.g. tp{ep}-ep{ep}")
    return pp * large
