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


def test_a_crash_on_cuda_says_how_much_device_memory_was_free(monkeypatch, capsys):
    """A library error that may be an allocation failure in disguise (cuDNN's INTERNAL_ERROR) carries the free device
    memory in its reason; an OOM does not need it, and a CPU cell (CUDA never initialized) has none to tell."""
    err = RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR")
    assert crash(Status.EAGER_FAIL, err).reason == "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(0.4 * 2**30), int(79.2 * 2**30)))
    stop = crash(Status.EAGER_FAIL, err)
    assert stop.status == Status.EAGER_FAIL
    assert stop.reason == ("RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"
                           " [device memory free at the crash: 0.4 of 79.2 GiB]")
    long = crash(Status.EAGER_FAIL, RuntimeError("x" * 5000)).reason
    assert long == ("RuntimeError: " + "x" * 5000)[:1800] + " [device memory free at the crash: 0.4 of 79.2 GiB]"
    assert "device memory" not in crash(Status.EAGER_FAIL, torch.cuda.OutOfMemoryError("out of memory")).reason

    def broken(*a):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "mem_get_info", broken)
    assert crash(Status.FAIL_RUN, err).reason == "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"
