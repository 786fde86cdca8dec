"""benchmarks/cells_retry.py: which cells of a gpu_cells.sh folder run again alone."""

from __future__ import annotations

import json

from benchmarks.cells_retry import retry


def test_out_of_memory_and_crashes_on_a_full_device_are_retried_nothing_else(tmp_path):
    cells = {
        1: {"status": "pass", "reason": ""},
        2: {"status": "oom", "reason": "OutOfMemoryError: CUDA out of memory."},
        3: {"status": "eager_fail", "reason": "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"
                                              " [device memory free at the crash: 0.4 of 79.2 GiB]"},
        4: {"status": "eager_fail", "reason": "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"
                                              " [device memory free at the crash: 41.0 of 79.2 GiB]"},  # its own
        5: {"status": "fail_accuracy", "reason": "tokens diverge"},
        10: {"status": "fail_run", "reason": "x [device memory free at the crash: 1.9 of 139.8 GiB]"},
    }
    for i, obj in cells.items():
        (tmp_path / f"{i}.json").write_text(json.dumps({"spec": {}, **obj}))
    (tmp_path / "6.json").write_text("")  # killed before it wrote anything
    assert retry(tmp_path) == [2, 3, 10]  # in list order, 10 after 3
    assert retry(tmp_path, free_gib=0.1) == [2]
