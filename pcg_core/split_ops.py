"""The registry of split ops: the ops a forward is cut at and that run eagerly between graphs.

Attention registers here today; linear attention, all-reduce and MoE all-to-all add themselves the same way,
and neither the FX splitter (piecewise) nor the segment recorder (breakable) needs to change. It sits below
both attention (which registers ops here) and capture (which cuts at them), so neither reaches into the other.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import torch

from pcg_core.forward_context import get_forward_context, has_forward_context

_SPLIT_OPS: dict[str, Any] = {}
_UNCAPTURABLE: set[str] = set()  # split ops that never get graphs of their own (they loop on the host)


def register_split_op(op: Any, capturable: bool = True) -> Any:
    """Register a torch.library op (packet or overload) as a split point. capturable=False: the op itself can never
    be recorded in a graph (piecewise keeps it eager even where the attention backend's op gets graphs)."""
    packet = getattr(op, "overloadpacket", op)
    name = str(packet._qualified_op_name)
    _SPLIT_OPS[name] = packet
    if not capturable:
        _UNCAPTURABLE.add(name)
    return op


def uncapturable_split_op_in(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` calls a split op registered as not capturable."""
    for node in gm.graph.nodes:
        if is_split_node(node):
            packet = getattr(node.target, "overloadpacket", node.target)
            if str(packet._qualified_op_name) in _UNCAPTURABLE:
                return True
    return False


def split_op_names() -> list[str]:
    return sorted(_SPLIT_OPS)


def is_split_node(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    packet = getattr(node.target, "overloadpacket", node.target)
    return any(packet is p for p in _SPLIT_OPS.values())


def run_split_op(fn: Callable[..., None], *args: Any) -> None:
    """Body of every split op's real implementation: under breakable capture the call becomes a hole."""
    recorder = get_forward_context().segment_recorder if has_forward_context() else None
    if recorder is not None:
        recorder.hole(fn, args)
    else:
        fn(*args)
