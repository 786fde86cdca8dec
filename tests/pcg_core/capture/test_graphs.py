"""CPU checks of the capture plumbing in pcg_core/capture/graphs.py that do not need a GPU (the GPU side is in
test_gpu.py: the collector paused during real captures, a failed capture ended)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from pcg_core.capture.graphs import GraphPool, no_gc_during_capture


class _Cycle:
    def __init__(self):
        self.me = self


def _dead_cycle() -> weakref.ref:
    gc.collect()  # nothing of the test's own making left pending
    obj = _Cycle()
    ref = weakref.ref(obj)
    del obj
    return ref


def test_garbage_is_collected_first_then_the_collector_is_off():
    ref = _dead_cycle()
    assert ref() is not None  # only the cyclic collector frees it
    with no_gc_during_capture():
        assert ref() is None
        assert not gc.isenabled()
        ref = _dead_cycle()
        for _ in range(10_000):
            _Cycle()  # enough allocations to trigger an automatic collection, were the collector on
        assert ref() is not None
    assert gc.isenabled()
    gc.collect()
    assert ref() is None


def test_the_collector_comes_back_after_an_error_and_stays_off_if_it_was_off():
    with pytest.raises(ValueError), no_gc_during_capture():
        raise ValueError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with no_gc_during_capture():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_abort_without_an_open_capture_does_nothing():
    pool = GraphPool(torch.device("cpu"))
    assert not pool.enabled and pool.open is None
    pool.abort()
    assert pool.open is None and pool.graphs_captured == 0
