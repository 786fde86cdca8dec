"""How a crash ends a cell: the status (OOM where running out of memory is what failed) and a reason naming every
error of the chain (on CUDA, with the device memory free at the crash); the traceback goes to the cell's log
(stderr), so a cell that failed on a device with no debugger says where, not only what."""

from __future__ import annotations

import sys
import traceback

import torch

from harness.outcome import Status


class Stop(Exception):
    """Ends the cell early in `status`, for `reason`."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def causes(e: BaseException, depth: int = 4) -> list[tuple[BaseException, bool]]:
    """`e` and the errors behind it, outermost first, each with whether it was raised *from* the one before (its
    cause) rather than while it was being handled (its context), by Python's own rule for a traceback: a wrapper
    such as transformers' lazy import ("Could not import module 'Qwen3MoeForCausalLM'") hides the error that says
    what went wrong."""
    chain = [(e, True)]
    while len(chain) < depth:
        last = chain[-1][0]
        caused = last.__cause__ is not None
        nxt = last.__cause__ if caused else None if last.__suppress_context__ else last.__context__
        if nxt is None or any(nxt is c for c, _ in chain):
            break
        chain.append((nxt, caused))
    return chain


def crash(status: Status, e: BaseException) -> Stop:
    """The status a crash ends the cell in: OOM when running out of memory is what failed (the error, or one it
    was raised from — not one handled before it), else `status`; the reason names every error of the chain."""
    chain = causes(e)
    raised_from = [e]
    for c, caused in chain[1:]:
        if not caused:
            break
        raised_from.append(c)
    oom = any(isinstance(c, torch.cuda.OutOfMemoryError) or "out of memory" in str(c).lower() for c in raised_from)
    parts = [f"{type(c).__name__}: {c}"[:1800 // len(chain)] for c, _ in chain]  # each link cut, not the root
    reason = parts[0] + "".join(f"; {'raised from' if caused else 'raised while handling'} {p}"
                                for p, (_, caused) in zip(parts[1:], chain[1:]))
    traceback.print_exception(e, file=sys.stderr)
    room = "" if oom else _device_room()
    return Stop(Status.OOM if oom else status, reason[: 2000 - len(room)] + room)


def _device_room() -> str:
    """How much device memory was free when a cell crashed on CUDA, for the reason: a library that fails to allocate
    may say only "internal error" (cuDNN's CUDNN_STATUS_INTERNAL_ERROR, loading its run-time compiled attention
    kernel while three cells filled an H100, 2026-12-07f), and the free memory beside it tells that failure from a
    shape the kernel refuses. Empty on a CPU, or where CUDA cannot say any more."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return ""
    try:
        free, total = torch.cuda.mem_get_info()
    except RuntimeError:  # the context itself broken by the crash
        return ""
    return f" [device memory free at the crash: {free / 2**30:.1f} of {total / 2**30:.1f} GiB]"
