"""The GEMMs on CUDA, one file per family: fp8_gemm (cuBLASLt scaled-mm), int8_gemm, w4a16_gemm, w4a8_gemm, fp4_gemm
(Triton, each a torch.library op with its plain-math reference on other devices) and moe_gemm (grouped experts)."""
