"""Every quantization scheme pcg knows, declared once: its name and aliases, what its weights and activations are,
what it needs from a GPU, which checkpoint formats hold it, which layer runs it and which kernels that layer calls.

Everything that speaks of schemes reads this table: the vocabulary a matrix is checked against (pcg_core.known),
the capability table and pre-check (pcg_core.capabilities), the math objects (w8a8.py, int4.py, fp4.py build
theirs from `math`), the loader's format detection (formats/detect.py), `pcgh request`, and the matrix filters
(a `family:` pattern selects schemes by what they are, not by how their names are spelled). Torch-free, so a
matrix is checked before the runtime is imported.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Literal

WeightKind = Literal["fp8", "int8", "int4", "fp4"]
Activations = Literal["16-bit", "int8", "fp8"]
Layer = Literal["QuantLinear", "Int4Linear", "W4A8Linear", "Fp4Linear"]


@dataclass(frozen=True)
class SchemeInfo:
    """One scheme's declaration. `math`: the math object's class (w8a8 Scheme, Int4Scheme, Fp4Scheme) and its
    fields; `matrix`: whether a matrix may name it (a checkpoint-only variant such as static INT8 may not)."""

    name: str
    weights: WeightKind
    activations: Activations
    description: str
    math: tuple[Literal["w8a8", "int4", "fp4"], dict[str, Any]]
    layer: Layer
    kernels: tuple[str, ...]  # modules under pcg_core/quant/kernels/ the layer calls on CUDA
    formats: tuple[str, ...]  # checkpoint formats (quant_method values; ModelOpt's algos) that hold the scheme
    needs: str  # what it needs from a GPU to run its kernels (elsewhere the reference math runs)
    aliases: tuple[str, ...] = ()
    matrix: bool = True

    @property
    def family(self) -> str:
        """w8a8, w4a8 or w4a16: weight bits × activation bits, the family a matrix filter names."""
        wbits = 8 if self.weights in ("fp8", "int8") else 4
        return f"w{wbits}a{16 if self.activations == '16-bit' else 8}"

    @property
    def families(self) -> tuple[str, ...]:
        """Every family word that selects this scheme: its bits family and its weights' number type."""
        return (self.family, self.weights)


_FP8_GPU = "FP8 tensor cores (compute capability 8.9+: Ada, Hopper)"
_TRITON_GPU = "CUDA with Triton (any compute capability 8.0+)"

_SCHEMES: tuple[SchemeInfo, ...] = (
    SchemeInfo("fp8_per_tensor", "fp8", "fp8",
               "FP8 e4m3, one scale per weight and a static one per activation (ModelOpt FP8, compressed-tensors FP8)",
               ("w8a8", dict(kind="fp8", weights="tensor", acts="tensor", act_dynamic=False)),
               "QuantLinear", ("fp8_gemm",), ("modelopt", "compressed-tensors"), _FP8_GPU),
    SchemeInfo("fp8_per_token", "fp8", "fp8",
               "FP8 e4m3, per-channel weights × per-token dynamic activations (compressed-tensors FP8_DYNAMIC, "
               "ModelOpt FP8_PER_CHANNEL_PER_TOKEN, fbgemm_fp8)",
               ("w8a8", dict(kind="fp8", weights="channel", acts="token", act_dynamic=True)),
               "QuantLinear", ("fp8_gemm",), ("modelopt", "compressed-tensors"), _FP8_GPU),
    SchemeInfo("fp8_block", "fp8", "fp8",
               "FP8 e4m3, 128×128 weight blocks × 1×128 dynamic activation groups (HF fp8 as DeepSeek-V3 and "
               "Qwen3-FP8 ship it, compressed-tensors FP8_BLOCK)",
               ("w8a8", dict(kind="fp8", weights="block", acts="group", act_dynamic=True)),
               "QuantLinear", ("fp8_gemm", "moe_gemm"), ("fp8", "compressed-tensors"), _FP8_GPU),
    SchemeInfo("int8_w8a8", "int8", "int8",
               "INT8, per-channel weights × per-token dynamic activations, symmetric (compressed-tensors INT8_W8A8, "
               "SGLang w8a8_int8)",
               ("w8a8", dict(kind="int8", weights="channel", acts="token", act_dynamic=True)),
               "QuantLinear", ("int8_gemm", "moe_gemm"), ("compressed-tensors", "w8a8_int8"), _TRITON_GPU),
    SchemeInfo("int8_w8a8_static", "int8", "int8",
               "INT8, per-channel weights × one static activation scale (compressed-tensors int-quantized, static)",
               ("w8a8", dict(kind="int8", weights="channel", acts="tensor", act_dynamic=False)),
               "QuantLinear", ("int8_gemm",), ("compressed-tensors",), _TRITON_GPU, matrix=False),
    SchemeInfo("awq", "int4", "16-bit",
               "int4 weights with zero points per group of 128, 16-bit activations (AutoAWQ gemm)",
               ("int4", dict(group=128, sym=False, act_order=False)),
               "Int4Linear", ("w4a16_gemm", "moe_gemm"), ("awq", "compressed-tensors"), _TRITON_GPU),
    SchemeInfo("gptq", "int4", "16-bit",
               "int4 weights, symmetric per group of 128, act-order (GPTQ desc_act), 16-bit activations",
               ("int4", dict(group=128, sym=True, act_order=True)),
               "Int4Linear", ("w4a16_gemm", "moe_gemm"), ("gptq", "compressed-tensors"), _TRITON_GPU),
    SchemeInfo("w4a8", "int4", "int8",
               "int4 weights, symmetric per group of 128 × int8 activations, dynamic per token (compressed-tensors "
               "W4A8)",
               ("int4", dict(group=128, sym=True, act_order=False, activations="int8")),
               "W4A8Linear", ("w4a8_gemm", "moe_gemm"), ("compressed-tensors",), _TRITON_GPU),
    SchemeInfo("w4afp8", "int4", "fp8",
               "int4 weights, symmetric per group of 128 × FP8 e4m3 activations, dynamic per token "
               "(compressed-tensors W4AFP8)",
               ("int4", dict(group=128, sym=True, act_order=False, activations="fp8")),
               "W4A8Linear", ("w4a8_gemm", "fp8_gemm", "moe_gemm"), ("compressed-tensors",), _FP8_GPU),
    SchemeInfo("nvfp4", "fp4", "16-bit",
               "NVFP4 W4A16: e2m1 weights, an e4m3 scale per block of 16 and an fp32 global; activations stay 16-bit "
               "(ModelOpt NVFP4, compressed-tensors NVFP4A16/NVFP4; Hopper has no FP4 MMA)",
               ("fp4", dict(block=16)),
               "Fp4Linear", ("fp4_gemm", "moe_gemm"), ("modelopt", "compressed-tensors"), _TRITON_GPU,
               aliases=("fp4",)),
    SchemeInfo("mxfp4", "fp4", "16-bit",
               "MXFP4 W4A16: e2m1 weights, a power-of-two (e8m0) scale per block of 32, no global; activations stay "
               "16-bit (OCP MX, gpt-oss's experts)",
               ("fp4", dict(block=32)),
               "Fp4Linear", ("fp4_gemm", "moe_gemm"), ("mxfp4",), _TRITON_GPU),
)

SCHEME_INFO: dict[str, SchemeInfo] = {s.name: s for s in _SCHEMES}
ALIASES: dict[str, str] = {a: s.name for s in _SCHEMES for a in s.aliases}
# Names a matrix may use for the runtime's schemes, in declaration order ("none": no quantization).
MATRIX_SCHEMES: tuple[str, ...] = tuple(s.name for s in _SCHEMES if s.matrix)
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(f for s in _SCHEMES for f in s.families))
FAMILY_PREFIX = "family:"
# Checkpoint formats the loader reads (quant_method values, and ModelOpt's hf_quant_config.json).
FORMATS: tuple[str, ...] = tuple(dict.fromkeys(f for s in _SCHEMES for f in s.formats))


def canonical(name: str) -> str:
    """The scheme's own name for `name` (an alias such as `fp4`, kept so stored runs still read); others as given."""
    return ALIASES.get(name, name)


def info(name: str) -> SchemeInfo:
    """The declaration of scheme `name` (or an alias); KeyError naming the known schemes otherwise."""
    found = SCHEME_INFO.get(canonical(name))
    if found is None:
        raise KeyError(f"quantization scheme {name!r} is not one of {', '.join(SCHEME_INFO)} "
                       f"(aliases: {', '.join(f'{a} = {n}' for a, n in ALIASES.items())})")
    return found


def math_params(kind: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, description, fields) of every scheme whose math object is of `kind` (w8a8, int4, fp4)."""
    return [(s.name, s.description, dict(s.math[1])) for s in _SCHEMES if s.math[0] == kind]


def in_family(name: str, pattern: str) -> bool:
    """Whether scheme `name` belongs to a family matching `pattern` (a glob: `w4a16`, `w?a8`, `fp8`)."""
    s = SCHEME_INFO.get(canonical(name))
    return s is not None and any(fnmatch.fnmatchcase(f, pattern) for f in s.families)


def quant_matches(pattern: str, value: str) -> bool:
    """A matrix rule's quant pattern against a cell's quant value: `family:GLOB` by family, else a glob on the
    name (an alias in the pattern or the value reads as its scheme)."""
    if pattern.startswith(FAMILY_PREFIX):
        return in_family(value, pattern[len(FAMILY_PREFIX):])
    return fnmatch.fnmatchcase(canonical(value), canonical(pattern)) or fnmatch.fnmatchcase(value, pattern)

