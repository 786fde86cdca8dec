"""A rank's process group is freed by shutdown(), even where dynamo is first imported after the group is made (as
a model's first transformers import does): a group left alive keeps gloo's threads into the interpreter's exit,
where they can abort a rank that has finished its work (seen in CI as SIGABRT after every result was right)."""

from __future__ import annotations

import gc
import weakref

from tp_ranks import run_ranks


def _group_freed(rank: int) -> bool:
    import torch
    import torch.distributed as dist

    from pcg_core.distributed import init_from_env, shutdown
    from pcg_core.distributed.group import get_group

    group = init_from_env("cpu")
    assert group is not None
    world = weakref.ref(get_group(group.name))
    import torch._dynamo  # noqa: F401  (after the group, as a model build does)

    t = torch.full((3,), float(rank))
    dist.all_reduce(t, group=world())
    shutdown()
    gc.collect()
    return world() is None


def test_shutdown_frees_the_group_even_with_dynamo_imported_after_it():
    assert run_ranks(_group_freed, world=2) == [True, True]
