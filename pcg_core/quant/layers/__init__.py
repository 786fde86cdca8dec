"""The modules swapped into transformers' model: QuantLinear (8-bit), Int4Linear and W4A8Linear, Fp4Linear, and the
quantized forwards of fused MoE experts (experts.py, fp4_experts.py, over expert_layout.py's views)."""
