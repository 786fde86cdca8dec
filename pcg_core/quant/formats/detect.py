"""Checkpoint formats: which quantization a checkpoint declares, read from its config, mapped onto a scheme.

A format is how a producer writes a scheme to disk: where the declaration lives (config.json's
`quantization_config`, or ModelOpt's `hf_quant_config.json`), which layers it leaves alone, and what the weight
scale is called. `detect()` is the one place that reads those declarations; anything it cannot map exactly
is refused with the format's name and what is supported, so a quantized checkpoint never loads as if it were
not (transformers 5.17 does that with ModelOpt and w8a8_int8 checkpoints).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pcg_core.errors import UnsupportedModel
from pcg_core.quant.schemes.fp4 import FP4_SCHEMES, NVFP4_BLOCK, Fp4Scheme
from pcg_core.quant.formats.fp4 import Fp4Format
from pcg_core.quant.schemes.int4 import Int4Scheme
from pcg_core.quant.formats.int4 import CT_INT, Int4Format
from pcg_core.quant.schemes.w8a8 import INT8_STATIC, SCHEMES, Scheme, get_scheme
from pcg_core.quant.formats.kv_scales import KvCacheSpec, ct_kv_cache, modelopt_kv_cache

HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's legacy declaration, beside config.json
MODELOPT_ALGOS = {"FP8": "fp8_per_tensor", "FP8_PER_CHANNEL_PER_TOKEN": "fp8_per_token"}
SUPPORTED_FORMATS = (
    "fp8 (HF/DeepSeek 128×128 blocks)",
    "compressed-tensors (float-quantized / int-quantized: FP8, FP8_DYNAMIC, FP8_BLOCK, INT8_W8A8 static or dynamic)",
    "modelopt (FP8, FP8_PER_CHANNEL_PER_TOKEN, NVFP4 group 16 run as W4A16; config.json or hf_quant_config.json)",
    "w8a8_int8 (SGLang)",
    "awq (AutoAWQ gemm: 4-bit, zero points, group 32/64/128)",
    "gptq (4-bit, checkpoint_format gptq or gptq_v2, sym or not, group -1/32/64/128, desc_act)",
    "compressed-tensors pack-quantized (W4A16: 4-bit int weights, sym or not, group or channel, actorder; W4A8 / "
    "W4AFP8: the same weights × int8 / FP8 activations per token, dynamic)",
    "compressed-tensors int-quantized W4A8 / W4AFP8 (llm-compressor's layout: 4-bit int weights stored as int8, sym or "
    "not, group or channel, without act-order; × int8 / FP8 activations per token, dynamic)",
    "compressed-tensors nvfp4-pack-quantized (NVFP4A16; NVFP4 W4A4 run as W4A16)",
    "mxfp4 (gpt-oss: MoE experts as e2m1 blocks + e8m0 scales per 32, everything else 16-bit)",
    "an FP8 KV cache declared by modelopt or compressed-tensors (per-tensor k/v scales read and checked; the KV cache "
    "runs in the model dtype)",
)
INT4_GROUPS = {"awq": (32, 64, 128), "gptq": (-1, 32, 64, 128), "compressed-tensors": (-1, 32, 64, 128)}


@dataclass(frozen=True)
class QuantSpec:
    """What a checkpoint declares: its format, the scheme its quantized linears use, the layers it leaves in
    16 bits (names or patterns, the format's own syntax), and the weight scale's tensor name; for int4 weights
    (`scheme` an Int4Scheme named by its family, awq or gptq, with the checkpoint's own group and symmetry) and
    NVFP4 ones (`scheme` the fp4 Fp4Scheme) how the files store them; `kv_cache` when it declares an FP8 KV cache
    (its k/v scales are then read: kv_scales.py)."""

    format: str
    scheme: Scheme | Int4Scheme | Fp4Scheme
    ignore: tuple[str, ...] = ()
    weight_scale_name: str = "weight_scale"
    where: str = "config.json"
    int4: Int4Format | None = None
    fp4: Fp4Format | None = None
    kv_cache: KvCacheSpec | None = None

    def ignored(self, module: str) -> bool:
        return ignored(module, self.ignore)


def ignored(module: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Whether `module` (a dotted name, as the files spell it) is among the layers a declaration leaves unquantized:
    `re:` patterns match at the start (compressed-tensors' rule: Kimi-K2-Thinking's `re:.*self_attn.*`), others
    by name, glob or dotted suffix. The reader and the writer of synthetic checkpoints share it, so a written
    ignore list means what it means to a loader."""
    for pat in patterns:
        if pat.startswith("re:"):
            if re.match(pat[3:], module):
                return True
        elif module == pat or fnmatch.fnmatchcase(module, pat) or module.endswith("." + pat):
            return True
    return False


def _refuse(where: str, what: str) -> UnsupportedModel:
    return UnsupportedModel(f"{where}: {what}. Supported quantized formats: {'; '.join(SUPPORTED_FORMATS)}")


def detect(config_data: dict[str, Any], model_dir: str | Path | None = None) -> QuantSpec | None:
    """The checkpoint's quantization, or None when it declares none. `model_dir` is where hf_quant_config.json
    would be. Raises UnsupportedModel for a declaration it cannot map exactly."""
    legacy = Path(model_dir) / HF_QUANT_CONFIG if model_dir is not None else None
    qc = config_data.get("quantization_config")
    if legacy is not None and legacy.is_file():
        if qc and not (isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "modelopt"):
            raise _refuse(str(legacy), "declares a quantization and so does config.json's quantization_config; "
                                       "remove the stale one")
        try:
            data = json.loads(legacy.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UnsupportedModel(f"{legacy}: unreadable ({e}); it declares the checkpoint's quantization, so the "
                                   "weights cannot be loaded without it") from e
        spec = _modelopt(data.get("quantization") or {}, str(legacy), data.get("producer", {}).get("name", "modelopt"))
        if qc:  # ModelOpt's export writes both: hf_quant_config.json and its conversion into config.json
            _same_modelopt(spec, _modelopt(qc, "config.json quantization_config", "modelopt"), legacy)
        return spec
    if not qc:
        return None
    where = "config.json quantization_config"
    if not isinstance(qc, dict):
        raise _refuse(where, f"is a {type(qc).__name__}, not a mapping")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        return _hf_fp8(qc, where)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    if method == "modelopt":
        return _modelopt(qc, where, "modelopt")
    if method == "w8a8_int8":
        return QuantSpec("w8a8_int8", SCHEMES["int8_w8a8"], tuple(qc.get("ignore") or ()), where=where)
    if method == "awq":
        return _awq(qc, where)
    if method == "gptq":
        return _gptq(qc, where)
    if method == "mxfp4":  # gpt-oss: the experts' blocks/scales tensors; the modules it lists stay 16-bit
        return QuantSpec("mxfp4", FP4_SCHEMES["mxfp4"], tuple(qc.get("modules_to_not_convert") or ()), where=where)
    raise _refuse(where, f"quant_method {method or '(none)'!r} is not supported yet")


def _variant(name: str, **fields: Any) -> Scheme | Int4Scheme | Fp4Scheme:
    """Scheme `name` (schemes/registry.py) as this checkpoint declares it: its own group, symmetry, description."""
    return dataclasses.replace(get_scheme(name), **fields)


def _same_modelopt(legacy: QuantSpec, converted: QuantSpec, path: Path) -> None:
    """hf_quant_config.json and config.json's quantization_config, as ModelOpt's export writes them side by side,
    must say the same (scheme, excluded modules, KV cache); a disagreement means one of them is stale."""
    got = {"scheme": (legacy.scheme.name, converted.scheme.name), "excluded modules": (set(legacy.ignore),
           set(converted.ignore)), "FP8 KV cache": (legacy.kv_cache is not None, converted.kv_cache is not None)}
    bad = [f"{k} {a!r} vs {b!r}" for k, (a, b) in got.items() if a != b]
    if bad:
        raise _refuse(str(path), f"and config.json's quantization_config disagree ({'; '.join(bad)}); one of them is "
                                 "stale: remove it")


def _hf_fp8(qc: dict[str, Any], where: str) -> QuantSpec:
    block = qc.get("weight_block_size")
    if list(block or []) != [128, 128]:
        raise _refuse(where, f"fp8 with weight_block_size {block!r}: only [128, 128] blocks are supported yet")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise _refuse(where, f"fp8 blocks with activation_scheme {qc.get('activation_scheme')!r}: only dynamic")
    if qc.get("fmt", "e4m3") != "e4m3":
        raise _refuse(where, f"fp8 fmt {qc.get('fmt')!r}: only e4m3")
    if qc.get("dequantize"):
        raise _refuse(where, "fp8 with dequantize=true asks for 16-bit weights; load the checkpoint's quantized weights "
                             "instead or a 16-bit checkpoint")
    ignore = tuple(qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ())
    return QuantSpec("fp8", SCHEMES["fp8_block"], ignore, weight_scale_name="weight_scale_inv", where=where)


def _modelopt(q: dict[str, Any], where: str, producer: str) -> QuantSpec:
    spec = _modelopt_weights(q, where, producer)
    return replace(spec, kv_cache=modelopt_kv_cache(q, where))


def _modelopt_weights(q: dict[str, Any], where: str, producer: str) -> QuantSpec:
    if producer != "modelopt":
        raise _refuse(where, f"producer {producer!r} is not ModelOpt")
    algo = str(q.get("quant_algo", ""))
    if "AWQ" in algo.upper() and "NVFP4" in algo.upper():
        raise _refuse(where, f"ModelOpt quant_algo {algo!r}: NVFP4-AWQ (pre_quant_scale, an activation pre-scale per input "
                             "channel) is not read yet; plain NVFP4 is")
    if algo not in MODELOPT_ALGOS and algo != "NVFP4":
        raise _refuse(where, f"ModelOpt quant_algo {algo or '(none)'!r} is not supported yet")
    ignore = tuple(q.get("exclude_modules") or q.get("ignore") or ())
    if algo == "NVFP4":
        if (group := q.get("group_size", NVFP4_BLOCK)) != NVFP4_BLOCK:
            raise _refuse(where, f"ModelOpt NVFP4 with group_size {group!r}: NVFP4 blocks are {NVFP4_BLOCK} wide")
        scheme = _variant("nvfp4", description="ModelOpt NVFP4 checkpoint: e2m1 weights, e4m3 scales per 16, an fp32 "
                                               "global; declared W4A4, run as W4A16 (input_scale checked, not applied)")
        return QuantSpec("modelopt", scheme, ignore, where=where, fp4=Fp4Format("modelopt", act_scale=True))
    return QuantSpec("modelopt", SCHEMES[MODELOPT_ALGOS[algo]], ignore, where=where)


def _int4_group(fmt: str, group: Any, where: str) -> int:
    if group not in INT4_GROUPS[fmt]:
        raise _refuse(where, f"{fmt} group_size {group!r}: the int4 loader reads groups of "
                             f"{', '.join(map(str, INT4_GROUPS[fmt]))} (-1: one per output channel)")
    return int(group)


def _four_bits(fmt: str, bits: Any, where: str) -> None:
    if bits != 4:
        raise _refuse(where, f"{fmt} with {bits}-bit weights: only 4-bit ones are read")


def _awq(qc: dict[str, Any], where: str) -> QuantSpec:
    _four_bits("awq", qc.get("bits", qc.get("w_bit")), where)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse(where, f"AWQ version {version!r}: only 'gemm' (AutoAWQ's default layout) is read; the gemv, exllama, "
                             "marlin and ipex layouts pack differently")
    if not qc.get("zero_point", True):
        raise _refuse(where, "AWQ without zero points (zero_point: false) is not read yet")
    group = _int4_group("awq", qc.get("group_size", qc.get("q_group_size", 128)), where)
    ignore = tuple(f"*{m}*" for m in qc.get("modules_to_not_convert") or ())  # AutoAWQ's rule: a substring
    scheme = _variant("awq", group=group, sym=False, act_order=False,
                        description=f"AWQ gemm checkpoint: int4 weights with zero points per group of {group}")
    return QuantSpec("awq", scheme, ignore, where=where, int4=Int4Format("awq", group))


def _gptq(qc: dict[str, Any], where: str) -> QuantSpec:
    _four_bits("gptq", qc.get("bits"), where)
    fmt = str(qc.get("checkpoint_format", qc.get("format", "gptq"))).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(where, f"GPTQ checkpoint_format {fmt!r}: only gptq (v1, zeros stored minus one) and gptq_v2 are "
                             "read; marlin and bitblas are repacked runtime layouts")
    if qc.get("dynamic"):
        raise _refuse(where, "GPTQ with per-module overrides (dynamic) is not read yet: one bit width and group size "
                             "for every layer")
    if qc.get("lm_head"):
        raise _refuse(where, "a GPTQ-quantized lm_head (lm_head: true) is not read yet")
    group = _int4_group("gptq", qc.get("group_size", 128), where)
    sym, act_order = bool(qc.get("sym", True)), bool(qc.get("desc_act", False))
    scheme = _variant("gptq", group=group, sym=sym, act_order=act_order,
                        description=f"GPTQ checkpoint ({fmt}): int4 weights, {'symmetric' if sym else 'zero points'}, "
                                    f"group {group}{', act-order' if act_order else ''}")
    return QuantSpec("gptq", scheme, (), where=where, int4=Int4Format(fmt, group))


def _one_ct_group(qc: dict[str, Any], where: str) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """(where it is, its weights, its input_activations) of a compressed-tensors checkpoint's one config group
    targeting Linear layers."""
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise _refuse(where, f"{len(groups)} config_groups; one scheme per checkpoint is supported")
    name, g = next(iter(groups.items()))
    here = f"{where} config_groups.{name}"
    if (g.get("targets") or []) != ["Linear"]:
        raise _refuse(here, f"targets {g.get('targets')}: only ['Linear']")
    return here, g.get("weights") or {}, g.get("input_activations")


def _ct_int4_group(w: dict[str, Any], here: str, fmt: str) -> int:
    """The group of a compressed-tensors config group's 4-bit weights (-1: per channel), in either format that
    holds them (pack-quantized, int-quantized): static int weights per group or per channel, or refused by name."""
    if w.get("type", "int") != "int" or w.get("dynamic"):
        raise _refuse(here, f"{w.get('type')} weights{' (dynamic)' if w.get('dynamic') else ''}: {fmt} 4-bit weights "
                            "are read as static int weights")
    strategy = w.get("strategy")
    if strategy not in ("group", "channel"):
        raise _refuse(here, f"weight strategy {strategy!r}: {fmt} 4-bit weights are read per group or per channel")
    return _int4_group("compressed-tensors", -1 if strategy == "channel" else w.get("group_size"), here)


def _ct_pack_quantized(qc: dict[str, Any], where: str) -> QuantSpec:
    """compressed-tensors W4A16 (its `pack-quantized` format): runs as the gptq family (llm-compressor makes it
    with GPTQ; the weights are the same int4 groups)."""
    here, w, a = _one_ct_group(qc, where)
    acts = _w4a8_activations(a, here, "pack-quantized") if a is not None else None
    _four_bits("compressed-tensors pack-quantized", w.get("num_bits"), here)
    group = _ct_int4_group(w, here, "pack-quantized")
    actorder = w.get("actorder")
    if actorder not in (None, False, True, "group", "weight", "static"):
        raise _refuse(here, f"actorder {actorder!r}: only group, weight, static or none")
    sym = bool(w.get("symmetric", True))
    act_order = actorder in (True, "group")  # weight/static: groups stay contiguous in K, no g_idx
    name, preset = {None: ("gptq", "W4A16"), "int8": ("w4a8", "W4A8"), "fp8": ("w4afp8", "W4AFP8")}[acts]
    scheme = _variant(name, group=group, sym=sym, act_order=act_order, activations=acts,
                        description=f"compressed-tensors {preset}: int4 weights, {'symmetric' if sym else 'zero points'}, "
                                    f"{'per channel' if group == -1 else f'group {group}'}"
                                    f"{', act-order' if act_order else ''}"
                                    f"{f', {acts} activations per token (dynamic)' if acts else ''}")
    return QuantSpec("compressed-tensors", scheme, tuple(qc.get("ignore") or ()), where=where,
                     int4=Int4Format("compressed-tensors", group))


def _w4a8_activations(a: dict[str, Any], here: str, fmt: str) -> str:
    """The 8-bit activation type ("int8" or "fp8") of a W4A8 / W4AFP8 declaration in `fmt`: per-token, dynamic,
    symmetric, as compressed-tensors' presets write them; anything else is refused by name."""
    want = {"num_bits": 8, "strategy": "token", "dynamic": True, "symmetric": True}
    got = {k: a.get(k, True if k == "symmetric" else None) for k in want}
    kind = a.get("type", "int")
    if got != want or kind not in ("int", "float"):
        w16 = "16-bit activations (W4A16, no input_activations) or " if fmt == "pack-quantized" else ""
        raise _refuse(here, f"4-bit weights × activations {a}: {fmt} is read with {w16}8-bit activations per token, "
                            "dynamic and symmetric (W4A8: type int, W4AFP8: type float); static activation scales, "
                            "other strategies and other widths are not read")
    return "int8" if kind == "int" else "fp8"


def _ct_nvfp4(qc: dict[str, Any], where: str) -> QuantSpec:
    """compressed-tensors NVFP4 (`nvfp4-pack-quantized`): the NVFP4A16 preset, or the NVFP4 one (W4A4: fp4
    activations in blocks of 16 with a static global) run as W4A16, as ModelOpt's NVFP4 is."""
    here, w, a = _one_ct_group(qc, where)
    nvfp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": NVFP4_BLOCK}
    bad = {k: w.get(k) for k, v in nvfp4.items() if w.get(k) != v}
    if bad or not w.get("symmetric", True) or w.get("dynamic"):
        raise _refuse(here, f"weights {bad or {k: w.get(k) for k in ('symmetric', 'dynamic')}}: nvfp4-pack-quantized "
                            f"reads NVFP4 weights (4-bit float, tensor_group, group_size {NVFP4_BLOCK}, symmetric, static)")
    if a is not None:
        bad = {k: a.get(k) for k, v in nvfp4.items() if a.get(k) != v}
        if bad or a.get("dynamic") != "local":
            raise _refuse(here, f"NVFP4 weights × activations {bad or {'dynamic': a.get('dynamic')}}: only 16-bit "
                                "activations (NVFP4A16) or the NVFP4 preset's W4A4 ones (4-bit float, tensor_group 16, "
                                "dynamic 'local'), which run as W4A16")
    how = "declared W4A4, run as W4A16 (input_global_scale checked, not applied)" if a is not None else "W4A16"
    scheme = _variant("nvfp4", description=f"compressed-tensors NVFP4 checkpoint: e2m1 weights, e4m3 scales per 16, "
                                           f"an fp32 global (reciprocal); {how}")
    return QuantSpec("compressed-tensors", scheme, tuple(qc.get("ignore") or ()), where=where,
                     fp4=Fp4Format("compressed-tensors", act_scale=a is not None))


def _compressed_tensors(qc: dict[str, Any], where: str) -> QuantSpec:
    kv_cache = ct_kv_cache(qc.get("kv_cache_scheme"), where)
    return replace(_ct_weights(qc, where), kv_cache=kv_cache)


def _ct_weights(qc: dict[str, Any], where: str) -> QuantSpec:
    fmt = _ct_format(qc, where)
    if fmt not in ("float-quantized", "int-quantized", "naive-quantized", "pack-quantized", "nvfp4-pack-quantized"):
        raise _refuse(where, f"compressed-tensors format {fmt!r} is not read; the formats read are float-quantized, "
                             "int-quantized and naive-quantized (8-bit, and 4-bit int weights × 8-bit activations), "
                             "pack-quantized (4-bit int weights) and nvfp4-pack-quantized")
    if qc.get("quantization_status", "compressed") != "compressed":
        raise _refuse(where, f"compressed-tensors quantization_status {qc.get('quantization_status')!r}: only compressed "
                             "checkpoints (quantized weights on disk)")
    if fmt in ("pack-quantized", "nvfp4-pack-quantized"):
        return _ct_pack_quantized(qc, where) if fmt == "pack-quantized" else _ct_nvfp4(qc, where)
    groups = qc.get("config_groups") or {}
    if any(isinstance(g, dict) and (g.get("weights") or {}).get("num_bits") == 4 for g in groups.values()):
        return _ct_int_quantized(qc, where, fmt)
    schemes = {_ct_group(name, g, where) for name, g in groups.items()}
    if len(schemes) != 1:
        raise _refuse(where, f"{len(schemes)} different schemes in config_groups; one per checkpoint is supported")
    return QuantSpec("compressed-tensors", schemes.pop(), tuple(qc.get("ignore") or ()), where=where)


def _ct_format(qc: dict[str, Any], where: str) -> Any:
    """The checkpoint's compressed-tensors format: the top-level one, or the one its config groups name (recent
    compressed-tensors writes it in each group too; "mixed-precision" at the top when they differ)."""
    top = qc.get("format")
    named = {f for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict) and (f := g.get("format"))}
    if len(named) > 1:
        raise _refuse(where, f"config_groups in formats {sorted(named)}; one format per checkpoint is read")
    if named:
        (one,) = named
        if top not in (None, one, "mixed-precision"):
            raise _refuse(where, f"format {top!r}, but its config_groups say {one!r}; the declaration contradicts itself")
        return one
    return top


def _ct_int_quantized(qc: dict[str, Any], where: str, fmt: str) -> QuantSpec:
    """compressed-tensors W4A8 / W4AFP8 in `int-quantized` (or `naive-quantized`, the same tensors): what
    llm-compressor writes for int weights with quantized activations. The same Int4Scheme as pack-quantized's,
    read from int8 values (int4_checkpoint.CT_INT)."""
    here, w, a = _one_ct_group(qc, where)
    if a is None:
        raise _refuse(here, f"4-bit weight-only in {fmt}: 4-bit int weights are read from {fmt} with 8-bit activations "
                            "(W4A8, W4AFP8) and weight-only (W4A16) from pack-quantized")
    acts = _w4a8_activations(a, here, fmt)
    group = _ct_int4_group(w, here, fmt)
    actorder = w.get("actorder")
    if actorder in (True, "group"):
        raise _refuse(here, f"actorder {actorder!r} in {fmt}: that format stores no g_idx (compressed-tensors' own "
                            "compressor ignores it), so its groups are not known; act-order is read from pack-quantized")
    if actorder not in (None, False, "weight", "static"):
        raise _refuse(here, f"actorder {actorder!r}: only weight, static or none in {fmt}")
    sym = bool(w.get("symmetric", True))
    name, preset = {"int8": ("w4a8", "W4A8"), "fp8": ("w4afp8", "W4AFP8")}[acts]
    scheme = Int4Scheme(name, group, sym=sym, act_order=False, activations=acts,
                        description=f"compressed-tensors {preset} ({fmt}): int4 weights stored as int8, "
                                    f"{'symmetric' if sym else 'zero points'}, "
                                    f"{'per channel' if group == -1 else f'group {group}'}, {acts} activations per "
                                    "token (dynamic)")
    return QuantSpec("compressed-tensors", scheme, tuple(qc.get("ignore") or ()), where=where,
                     int4=Int4Format(CT_INT, group))


def _ct_group(name: str, g: dict[str, Any], where: str) -> Scheme:
    w, a = g.get("weights") or {}, g.get("input_activations")
    here = f"{where} config_groups.{name}"
    targets = g.get("targets") or []
    if targets != ["Linear"]:
        raise _refuse(here, f"targets {targets}: only ['Linear']")
    if a is None:
        raise _refuse(here, f"{w.get('num_bits')}-bit {w.get('type')} weight-only quantization (no input_activations) is "
                            "not read; weight-only checkpoints are read as pack-quantized int4 (W4A16) and "
                            "nvfp4-pack-quantized (NVFP4A16), 8-bit weight-only (W8A16) not yet")
    if w.get("num_bits") != 8 or a.get("num_bits") != 8:
        raise _refuse(here, f"{w.get('num_bits')}-bit weights × {a.get('num_bits')}-bit activations: float-/int-quantized "
                            "is read with 8-bit weights × 8-bit activations (FP8, INT8) and 4-bit int weights × 8-bit "
                            "activations (W4A8, W4AFP8); other widths are not read")
    if not (w.get("symmetric", True) and a.get("symmetric", True)):
        raise _refuse(here, "asymmetric (zero-point) 8-bit weights or activations: 8-bit schemes are read symmetric only "
                            "(zero points are read for 4-bit weights)")
    key = (w.get("type"), w.get("strategy"), a.get("strategy"), bool(a.get("dynamic")))
    table = {
        ("float", "tensor", "tensor", False): SCHEMES["fp8_per_tensor"],
        ("float", "channel", "token", True): SCHEMES["fp8_per_token"],
        ("float", "block", "group", True): SCHEMES["fp8_block"],
        ("int", "channel", "token", True): SCHEMES["int8_w8a8"],
        ("int", "channel", "tensor", False): INT8_STATIC,
    }
    if key not in table:
        raise _refuse(here, f"weights {key[0]}/{key[1]} × activations {key[2]} ({'dynamic' if key[3] else 'static'}) is not "
                            "a supported combination")
    if key[1] == "block" and (list(w.get("block_structure") or []) != [128, 128] or a.get("group_size") != 128):
        raise _refuse(here, f"block_structure {w.get('block_structure')} / group_size {a.get('group_size')}: only 128×128 / 128")
    return table[key]


# Writing (synthetic checkpoints in the real formats) -----------------------------------------------------------
def declaration(fmt: str, scheme: Scheme, ignore: tuple[str, ...] = ("lm_head",), legacy: bool = False) -> tuple[dict | None, dict | None]:
    """(config.json quantization_config, hf_quant_config.json) as `fmt`'s producer writes them for `scheme`."""
    if fmt == "fp8":
        if scheme.name != "fp8_block":
            raise ValueError("HF fp8 checkpoints are written here with 128×128 blocks only")
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                "modules_to_not_convert": list(ignore)}, None
    if fmt == "modelopt":
        algo = {v: k for k, v in MODELOPT_ALGOS.items()}.get(scheme.name)
        if algo is None:
            raise ValueError(f"ModelOpt has no algo for {scheme.name} here")
        if legacy:
            return None, {"producer": {"name": "modelopt", "version": "0.29.0"},
                          "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": list(ignore)}}
        return {"quant_method": "modelopt", "quant_algo": algo, "ignore": list(ignore)}, None
    if fmt == "w8a8_int8":
        return {"quant_method": "w8a8_int8"}, None
    if fmt == "compressed-tensors":
        weights: dict[str, Any] = {"num_bits": 8, "type": "float" if scheme.kind == "fp8" else "int", "strategy": scheme.weights,
                   "symmetric": True, "dynamic": False}
        acts = {"num_bits": 8, "type": weights["type"], "strategy": scheme.acts, "symmetric": True,
                "dynamic": scheme.act_dynamic}
        if scheme.weights == "block":
            weights["block_structure"] = [128, 128]
            acts["group_size"] = 128
        return {"quant_method": "compressed-tensors", "format": "float-quantized" if scheme.kind == "fp8" else "int-quantized",
                "quantization_status": "compressed", "ignore": list(ignore), "kv_cache_scheme": None,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}, None
    raise ValueError(f"no writer for format {fmt!r}")
