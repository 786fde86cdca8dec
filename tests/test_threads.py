"""The suite's one global setting (tests/conftest.py): under pytest-xdist each worker takes its share of the cores."""

from __future__ import annotations

import os

import pytest
import torch

from harness.launcher.process import cpu_threads


def test_each_xdist_worker_takes_its_share_of_the_cores():
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        pytest.skip("not under pytest -n: the one process keeps torch's own thread count")
    done = os.environ.get("PCG_TEST_WORKER_THREADS")
    assert done is not None, "tests/conftest.py's pytest_configure did not run in this worker"
    if done == "caller":
        pytest.skip(f"the caller set OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, which stands")
    assert torch.get_num_threads() == int(done) == cpu_threads(int(workers))
