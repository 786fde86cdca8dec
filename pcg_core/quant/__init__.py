"""Quantization: the 8-bit schemes (the math), formats (what checkpoints declare), QuantLinear (the layer) and the
checkpoint loader/writer; int4 weights (int4.py: AWQ/GPTQ packings, Int4Linear) and FP4 ones (fp4.py: NVFP4/MXFP4
packings, Fp4Linear). pcg owns these; transformers stays the model definition."""

from pcg_core.quant.calibrate import record_input_absmax
from pcg_core.quant.formats.checkpoint import LoadReport, load_quantized, write_checkpoint
from pcg_core.quant.formats.detect import SUPPORTED_FORMATS, QuantSpec, detect
from pcg_core.quant.layers.fp4_linear import Fp4Linear
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES, Fp4Scheme
from pcg_core.quant.layers.int4_linear import Int4Linear
from pcg_core.quant.schemes.int4 import INT4_SCHEMES, Int4Scheme
from pcg_core.quant.layers.linear import QuantLinear, quantize_model, quantized_modules, scheme_of
from pcg_core.quant.schemes.w8a8 import SCHEMES, Scheme, get_scheme

__all__ = ["FP4_SCHEMES", "INT4_SCHEMES", "SCHEMES", "SUPPORTED_FORMATS", "Fp4Linear", "Fp4Scheme", "Int4Linear",
           "Int4Scheme", "LoadReport", "QuantLinear", "QuantSpec", "Scheme", "detect", "get_scheme", "load_quantized",
           "quantize_model", "quantized_modules", "record_input_absmax", "scheme_of", "write_checkpoint"]
