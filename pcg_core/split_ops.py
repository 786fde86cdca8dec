"""The registry of split ops: the ops a forward is cut at and that run eagerly between graphs.

Attention registers here today; linear attention, all-reduce and MoE all-to-all add themselves the same way,
and neither the FX splitter (piecewise) nor the segment recorder (breakable) needs to change. It sits below
both attention (which registers ops here) and capture (which cuts at them), so neither reaches into the other.
"""

from __future__ import annotations

import itertools
import weakref
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


# Split ops whose host-side body runs a module (MoE all-to-all dispatch runs the rank's experts on the tokens it
# received): a custom op cannot take a module, so the module is bound under a string key the op takes (Dynamo bakes
# it into the graph as a constant). Weak: a finished cell's model is not kept alive by its key.
MODULE_KEY = "pcg_split_key"
_MODULES: weakref.WeakValueDictionary[str, torch.nn.Module] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def bind_module(module: torch.nn.Module, prefix: str) -> str:
    """Bind `module` under a fresh key (also set on it as `pcg_split_key`), for a split op to find it by."""
    key = f"{prefix}#{next(_KEYS)}"
    _MODULES[key] = module
    setattr(module, MODULE_KEY, key)
    return key


def bound_module(key: str) -> torch.nn.Module:
    """The module bound under `key`; a KeyError says the module is gone (its model was freed)."""
    try:
        return _MODULES[key]
    except KeyError:
        raise KeyError(f"no module bound under {key!r}: its model was freed, or copied without rebind_copies") from None


def rebind_copies(root: torch.nn.Module) -> None:
    """Give every bound module under `root` a key of its own: after a deep copy (a reference twin), each copy's key
    is still its original's, and the copy's split ops would run the original's module."""
    for m in root.modules():
        key = getattr(m, MODULE_KEY, None)
        if isinstance(key, str):
            bind_module(m, key.rsplit("#", 1)[0])
