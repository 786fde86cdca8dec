"""Quantization, in rooms by role along the data path: schemes/ (the registry of every scheme and the plain math
each one stands for), kernels/ (one file per GEMM family), layers/ (the modules swapped into transformers' model),
formats/ (reading and writing each checkpoint format). pcg owns these; transformers stays the model definition.

The names below load on first use (PEP 562), so the torch-free registry (schemes/registry.py) can be read
without importing torch: a matrix's scheme names are checked before the runtime is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcg_core.lazy import lazy_exports

if TYPE_CHECKING:
    from pcg_core.quant.calibrate import producer_kv_scales, record_input_absmax
    from pcg_core.quant.formats.checkpoint import LoadReport, load_quantized, write_checkpoint
    from pcg_core.quant.formats.detect import SUPPORTED_FORMATS, QuantSpec, detect
    from pcg_core.quant.formats.kv_scales import KvCacheSpec
    from pcg_core.quant.layers.fp4_linear import Fp4Linear
    from pcg_core.quant.layers.int4_linear import Int4Linear
    from pcg_core.quant.layers.linear import QuantLinear, quantize_model, quantized_modules, scheme_of
    from pcg_core.quant.schemes.fp4 import FP4_SCHEMES, Fp4Scheme
    from pcg_core.quant.schemes.int4 import INT4_SCHEMES, Int4Scheme
    from pcg_core.quant.schemes.w8a8 import SCHEMES, Scheme, get_scheme

_EXPORTS = {
    "record_input_absmax": "pcg_core.quant.calibrate", "producer_kv_scales": "pcg_core.quant.calibrate",
    "KvCacheSpec": "pcg_core.quant.formats.kv_scales",
    "LoadReport": "pcg_core.quant.formats.checkpoint", "load_quantized": "pcg_core.quant.formats.checkpoint",
    "write_checkpoint": "pcg_core.quant.formats.checkpoint",
    "SUPPORTED_FORMATS": "pcg_core.quant.formats.detect", "QuantSpec": "pcg_core.quant.formats.detect",
    "detect": "pcg_core.quant.formats.detect",
    "Fp4Linear": "pcg_core.quant.layers.fp4_linear", "Int4Linear": "pcg_core.quant.layers.int4_linear",
    "QuantLinear": "pcg_core.quant.layers.linear", "quantize_model": "pcg_core.quant.layers.linear",
    "quantized_modules": "pcg_core.quant.layers.linear", "scheme_of": "pcg_core.quant.layers.linear",
    "FP4_SCHEMES": "pcg_core.quant.schemes.fp4", "Fp4Scheme": "pcg_core.quant.schemes.fp4",
    "INT4_SCHEMES": "pcg_core.quant.schemes.int4", "Int4Scheme": "pcg_core.quant.schemes.int4",
    "SCHEMES": "pcg_core.quant.schemes.w8a8", "Scheme": "pcg_core.quant.schemes.w8a8",
    "get_scheme": "pcg_core.quant.schemes.w8a8",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
