"""Linear attention (Qwen3-Next's Gated DeltaNet): the per-sequence state pool and the `pcg::linear_attention` split
op. A property of the split op, not of the attention backends: the full-attention layers of the same model use
whichever attention backend the cell names, and this op is the same under all of them."""

from pcg_core.linear_attention.op import CAPTURABLE, WHY_NOT_CAPTURABLE, linear_attention
from pcg_core.linear_attention.state import (LinearLayerShape, LinearStateFull, LinearStatePool, linear_layer_shape,
                                             linear_layers)

__all__ = ["CAPTURABLE", "WHY_NOT_CAPTURABLE", "LinearLayerShape", "LinearStateFull", "LinearStatePool",
           "linear_attention", "linear_layer_shape", "linear_layers"]
