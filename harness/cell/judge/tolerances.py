"""The judge's numbers: each bound with why it sits where it does, and the rules that widen one to a measured noise.

What each bounds, by layer (policy.py numbers them): LOGPROB_TOL, logprob_bound and tie_margin the tokens and
logprobs against unpadded eager (layer 4, and eager against itself, layer 1); KL_TOL the lockstep's KL and
same_padding_rtol its same-padding check (layer 3); PIECE_RTOL the first diverging piece (layer 5) too.
"""

from __future__ import annotations

import math

# Max |logprob(graph) - logprob(eager)| on agreeing positions. fp32: padded and unpadded GEMMs differ by
# reduction order only (~1e-6 measured); bf16/fp16: one rounding of 2^-8 relative per layer output, summed
# over the stack, moves logits by a few 1e-2 (upstream HF comparisons use ±5e-2 for logprobs).
LOGPROB_TOL = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 1e-1}
# Max KL(eager ‖ graph) at prompt positions. A logprob shift of δ on the likely tokens gives KL ≈ δ²/2, so these
# sit well above what the logprob bounds allow on agreeing tokens while still catching a skewed distribution.
KL_TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
# Relative difference of a piece's output (graph replay vs eager at the same padding) that names it as the
# first diverging piece; same kernels give 0, so this only has to stay above compiler-level noise.
PIECE_RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
# With the eager compiler a replay runs eager's own kernels at eager's shapes, so the graph at a bucket matches eager
# padded to that bucket bitwise (the runtime's guarantee, tests/pcg_core/test_gpu.py); this bound only leaves room
# for a nondeterministic kernel that eager-twice did not show. It is what catches, in half precision, an error of
# a percent or so that hides inside the logprob tolerance.
SAME_PADDING_RTOL_EAGER = 1e-3


def same_padding_rtol(dtype: str, compiler: str, eager_noise: float = 0.0) -> float:
    """Max relative difference of any forward's hidden states, graph vs eager at the graph's padding: compiler
    noise, or twice what eager run twice at one padding measured (a nondeterministic kernel), if that is more."""
    base = min(PIECE_RTOL[dtype], SAME_PADDING_RTOL_EAGER) if compiler == "eager" else PIECE_RTOL[dtype]
    return max(base, 2 * eager_noise) if math.isfinite(eager_noise) else base


def logprob_bound(tol: float, padding_noise: float = 0.0) -> float:
    """The bound on |Δlogprob| against unpadded eager: the dtype's tolerance, widened to what eager itself shows
    between the graph's padding and none (eager padded vs unpadded). Those differences are padding's, not the
    graph's: the same-padding check holds the graph to eager at its own padding, and the runtime's own tests hold
    padding rows apart from real ones (tests/pcg_core). Measured on the H200 in bf16: up to 0.1 on dense models
    24 layers deep, 0.24 on Mixtral×2, where a padded GEMM's rounding flips a router's choice of experts."""
    return max(tol, padding_noise) if math.isfinite(padding_noise) else tol


def tie_margin(tol: float, eager_self_diff: float | None = None) -> float:
    """The noise a token's logprob may move by: the logprob tolerance (what the logprob check itself accepts on
    agreeing tokens), or eager's own run-to-run difference where that is larger. A flip swaps two tokens, each
    moving by at most this, so eager's margin plus the graph's must fit in twice it."""
    measured = eager_self_diff if eager_self_diff is not None and math.isfinite(eager_self_diff) else 0.0
    return max(tol, measured)
