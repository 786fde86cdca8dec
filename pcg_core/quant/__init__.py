"""Quantization: the 8-bit schemes (the math), formats (what checkpoints declare), QuantLinear (the layer) and the
checkpoint loader/writer; int4 weights (int4.py: AWQ/GPTQ packings, Int4Linear) and FP4 ones (fp4.py: NVFP4/MXFP4
packings, Fp4Linear). pcg owns these; transformers stays the model definition."""

from pcg_core.quant.calibrate import calibrate_kv_scales, record_input_absmax
from pcg_core.quant.checkpoint import LoadReport, load_quantized, write_checkpoint
from pcg_core.quant.formats import SUPPORTED_FORMATS, QuantSpec, detect
from pcg_core.quant.fp4 import FP4_SCHEMES, Fp4Linear, Fp4Scheme
from pcg_core.quant.int4 import INT4_SCHEMES, Int4Linear, Int4Scheme
from pcg_core.quant.kv_scales import KvCacheSpec
from pcg_core.quant.linear import QuantLinear, quantize_model, quantized_modules, scheme_of
from pcg_core.quant.schemes import SCHEMES, Scheme, get_scheme

__all__ = ["FP4_SCHEMES", "INT4_SCHEMES", "SCHEMES", "SUPPORTED_FORMATS", "Fp4Linear", "Fp4Scheme", "Int4Linear",
           "Int4Scheme", "KvCacheSpec", "LoadReport", "QuantLinear", "QuantSpec", "Scheme", "calibrate_kv_scales", "detect", "get_scheme", "load_quantized",
           "quantize_model", "quantized_modules", "record_input_absmax", "scheme_of", "write_checkpoint"]
