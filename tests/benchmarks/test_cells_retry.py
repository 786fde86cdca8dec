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
        # a whole verdict whose reference layer ran out of memory beside others: again, for the layer
        11: {"status": "pass", "reason": "", "metrics": {"judge": {"reference": {
            "status": "not_measured", "reason": "OutOfMemoryError: CUDA out of memory. Tried to allocate 9.02 GiB."}}}},
        # not measured for another reason (a bug of its own): alone would not change it
        12: {"status": "pass", "reason": "", "metrics": {"judge": {"reference": {
            "status": "not_measured", "reason": "RuntimeError: mat1 and mat2 shapes cannot be multiplied"}}}},
        13: {"status": "pass", "reason": "", "metrics": {"judge": {"reference": None}}},
    }
    for i, obj in cells.items():
        (tmp_path / f"{i}.json").write_text(json.dumps({"spec": {}, **obj}))
    (tmp_path / "6.json").write_text("")  # killed before it wrote anything
    assert retry(tmp_path) == [2, 3, 10, 11]  # in list order, 10 after 3
    assert retry(tmp_path, free_gib=0.1) == [2, 11]


def test_a_retry_replaces_the_first_record_only_where_it_loses_no_verdict(tmp_path):
    from benchmarks.cells_retry import keep_again

    ref_oom = {"status": "pass", "reason": "", "metrics": {"judge": {"reference": {
        "status": "not_measured", "reason": "OutOfMemoryError: CUDA out of memory."}}}}
    whole = {"status": "pass", "reason": "", "metrics": {"judge": {"reference": {"status": "pass"}}}}
    failed = {"status": "fail_accuracy", "reason": "tokens diverge"}
    oom = {"status": "oom", "reason": "OutOfMemoryError"}
    full = {"status": "eager_fail", "reason": "x [device memory free at the crash: 0.3 of 79.2 GiB]"}

    def keep(first, again) -> bool:
        for name, obj in (("first", first), ("again", again)):
            (tmp_path / name).write_text("" if obj is None else json.dumps(obj))
        return keep_again(tmp_path / "first", tmp_path / "again")

    assert keep(ref_oom, whole) and keep(ref_oom, failed)  # the retry's verdict, whatever it is
    assert not keep(ref_oom, None) and not keep(ref_oom, oom) and not keep(ref_oom, full)  # killed, or short again
    assert keep(oom, whole) and keep(oom, full) and keep(None, oom)  # nothing whole was there to lose
    assert not keep(oom, None)  # killed: the first one's reason stays
