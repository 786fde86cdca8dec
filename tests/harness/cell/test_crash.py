"""A crash's status and reason, and its traceback in the cell's log."""

from __future__ import annotations

import torch

from harness.cell.crash import crash
from harness.outcome import Status


def _raise_chain():
    try:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    except torch.cuda.OutOfMemoryError as e:
        raise RuntimeError("the expert GEMM failed") from e


def test_an_oom_behind_a_wrapper_is_oom_and_the_traceback_names_the_line(capsys):
    try:
        _raise_chain()
    except RuntimeError as e:
        stop = crash(Status.EAGER_FAIL, e)
    assert stop.status == Status.OOM
    assert stop.reason.startswith("RuntimeError: the expert GEMM failed; raised from OutOfMemoryError")
    err = capsys.readouterr().err
    assert "Traceback" in err and "_raise_chain" in err and "test_crash.py" in err


def test_an_error_handled_before_the_crash_does_not_make_it_oom(capsys):
    try:
        try:
            raise torch.cuda.OutOfMemoryError("out of memory")
        except torch.cuda.OutOfMemoryError:
            raise ValueError("shape mismatch") from None
    except ValueError as e:
        stop = crash(Status.EAGER_FAIL, e)
    assert stop.status == Status.EAGER_FAIL and stop.reason == "ValueError: shape mismatch"
