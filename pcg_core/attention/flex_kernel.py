"""One compiled flex kernel (a token count and a modifier set): compiled once through dynamo, then called without it.

Every call of a `torch.compile`d function pays for dynamo's frame evaluation and its guards (the BlockMask's eight
tensors, the mask and score modifiers' closures) before inductor's kernel runs: host time in every attention hole
of a breakable forward, the whole of breakable's loss against full on flex (issue 38). The first call traces and
compiles as before (`CompileOnce`: inductor, deterministic, once); it also notes which of the graph's inputs is
which — the call's query, keys and values, a BlockMask field, or a static buffer the modifiers close over — and
checks that inductor's artifact, called with them, returns what dynamo's path returned, bit for bit. Later calls
then go straight to the artifact with their own tensors. Where any of that does not hold (an input it cannot
name, an output it cannot match, a call asking for the LSE, modifiers over other buffers) the call stays on
dynamo's path, which is always correct; `direct_off` says why.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention

BLOCK_MASK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                     "q_indices", "full_q_num_blocks", "full_q_indices")


class CompileOnce:
    """The compile backend of one flex kernel: inductor with `options`, once. A second compile of the same code
    object means a guard failed (an input changed shape, dtype or identity where dynamo had specialized): raise,
    naming the kernel, rather than recompile per call or, past dynamo's recompile limit, silently run the unfused
    and uncapturable eager flex. Checked here, at compile time, so a call pays nothing for it (a
    `torch._dynamo.config.patch` around every call, the previous guard, cost host time in every attention hole)."""

    def __init__(self, name: str, key: tuple, options: dict[str, Any] | None = None):
        self.name, self.key, self.options, self.compiled = name, key, options or {}, 0
        self.artifact: Any = None
        self.example_inputs: list[Any] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        from torch._inductor.compile_fx import compile_fx

        self.compiled += 1
        if self.compiled > 1:
            raise RuntimeError(f"flex kernel {self.name} {self.key} compiled a second time: a guard on its inputs failed "
                               "(a shape, dtype or closure tensor changed for the same token count); this is a bug")
        self.artifact = compile_fx(gm, example_inputs, config_patches=self.options)
        self.example_inputs = list(example_inputs)
        return self.artifact


def _flex_call(q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False, **kw):
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa, **kw)


class FlexKernel:
    """Called like flex_attention(q, k, v, score_mod=…, block_mask=…, scale=…, enable_gqa=…, **kw), plus `direct`:
    whether the modifiers close over the buffers the first call saw (the backend's static ones)."""

    def __init__(self, name: str, key: tuple, options: dict[str, Any]):
        import types

        code = _flex_call.__code__.replace(co_name=name, co_qualname=name) if hasattr(_flex_call.__code__, "co_qualname") \
            else _flex_call.__code__.replace(co_name=name)
        fn = types.FunctionType(code, _flex_call.__globals__, name, _flex_call.__defaults__)  # dynamo caches per code object
        self.compile_once = CompileOnce(name, key, options)
        self.dynamo = torch.compile(fn, fullgraph=True, dynamic=False, backend=self.compile_once)
        self.plan: list[tuple[str, Any]] | None = None
        self.direct_off = ""
        self.direct_calls = 0
        self.build_s = 0.0  # host seconds of the first call: dynamo's trace and inductor's compile (a cell reports it)

    def __call__(self, q, k, v, *, direct: bool = False, **kw) -> Any:
        if self.plan is not None and direct:
            self.direct_calls += 1
            return self._direct(self.plan, q, k, v, kw["block_mask"])
        first = self.compile_once.compiled == 0
        t0 = time.perf_counter()
        out = self.dynamo(q, k, v, **kw)
        if first:
            self.build_s = time.perf_counter() - t0
        if self.plan is None and direct and not self.direct_off:
            self._make_plan(q, k, v, kw, out)
        return out

    def _direct(self, plan: list[tuple[str, Any]], q, k, v, block_mask) -> torch.Tensor:
        call = (q, k, v)
        args = [call[x] if how == "arg" else getattr(block_mask, x) if how == "bm" else x for how, x in plan]
        return self.compile_once.artifact(*args)[0]

    def _make_plan(self, q, k, v, kw: dict, out: Any) -> None:
        """Name every graph input of the first call, then check the artifact against dynamo's output."""
        inputs, self.compile_once.example_inputs = self.compile_once.example_inputs, []
        if any(x in kw for x in ("return_lse", "return_aux")) or not isinstance(out, torch.Tensor):
            self.direct_off = "the call returns more than the attention (LSE): dynamo rebuilds that structure"
            return
        bm = kw.get("block_mask")
        statics = {id(c.cell_contents): c.cell_contents for f in (getattr(bm, "mask_mod", None), kw.get("score_mod"))
                   for c in (getattr(f, "__closure__", None) or ()) if isinstance(c.cell_contents, torch.Tensor)}
        plan: list[tuple[str, Any]] = []
        for x in inputs:
            if not isinstance(x, torch.Tensor):
                self.direct_off = f"a graph input that is not a tensor ({type(x).__name__})"
                return
            named = next((("arg", i) for i, t in enumerate((q, k, v)) if x is t), None) \
                or next((("bm", f) for f in BLOCK_MASK_FIELDS if getattr(bm, f, None) is x), None) \
                or (("static", statics[id(x)]) if id(x) in statics else None)
            if named is None:
                self.direct_off = f"a graph input it cannot name (shape {tuple(x.shape)})"
                return
            plan.append(named)
        self.plan = plan
        try:
            same = torch.equal(self._direct(plan, q, k, v, bm), out)
        except Exception as e:  # noqa: BLE001 - the dynamo path stays, and says why
            same, self.direct_off = False, f"the artifact refused the named inputs: {type(e).__name__}: {e}"[:200]
        if not same:
            self.plan = None
            self.direct_off = self.direct_off or "the artifact's output differs from dynamo's"
