"""PCG_PLUGINS module for the before/after of issue 47 on the H200: the FP8 128×128-block GEMM with the weight-scale
layout it had before the fix (a plain transpose: stride K/128, which cuBLASLt reads as if padded to 4), so a cell
shows what the reference layer says of it. Never loaded by anything but a device script that names it."""

import pcg_core.quant.linear as linear

linear.block_weight_scales = lambda scale: scale.t()
