"""A job of N identical ranks modeled from one process (`neuron-explorer capture --model-ranks
N`, or `NEURON_EXPLORER_MODEL_RANKS=N`): rank 0 is executed, ranks 1..N-1 are its copies.

`init_process_group` gets an in-process store, rank 0 and world size N, and every neuron
process group is torch's FakeProcessGroup of its size: collectives move no data and return at
once, and the runtime prices each for its group of N (runtime/collectives.py: with no store of
the group's, no rank waits for another, as identical ranks arrive together). Values a
collective writes (an all-gather's output, a sum) are not computed: use it with shapes-only
mode, or where values do not matter. DDP, FSDP2, DTensor tensor parallelism and device meshes
run over these groups as over real ones, and so do pipeline schedules: rank 0 runs stage 0,
the other stages are its copies (backend/pipeline_ranks.py). Any other object asked of another
rank (`recv_object_list`) cannot come, and the run says so.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

from neuron_explorer.errors import ExplorerError

ENV = "NEURON_EXPLORER_MODEL_RANKS"


def world_size() -> int:
    """The modeled job's size, 0 when this process is not modeling one."""
    raw = os.environ.get(ENV, "")
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ExplorerError(f"{ENV}={raw!r}: expected a number of ranks >= 1")
    return n


def enable(n: int) -> None:
    """Model a job of `n` ranks from this process: the environment torchrun would give rank 0
    (RANK, WORLD_SIZE, LOCAL_RANK, ...), and `init_process_group` on an in-process store."""
    if n < 1:
        raise ExplorerError(f"--model-ranks {n}: expected a number of ranks >= 1")
    os.environ.update({
        ENV: str(n), "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": os.environ.get("MASTER_PORT", "29500"),
    })  # fmt: skip
    install()


def install() -> None:
    """Wrap `torch.distributed.init_process_group` (idempotent); a no-op unless modeling."""
    if not world_size():
        return
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_neuron_model_ranks", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        bound.arguments.update(backend="neuron", init_method=None, rank=0,
                               world_size=world_size(), store=dist.HashStore())  # fmt: skip
        return original(*bound.args, **bound.kwargs)

    init_process_group._neuron_model_ranks = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.recv_object_list = _no_object_from_a_copy(dist.recv_object_list)
    from neuron_explorer.backend import pipeline_ranks

    pipeline_ranks.install()


def _no_object_from_a_copy(recv_object_list: Any) -> Any:
    """`recv_object_list` of a modeled job: the other ranks never run, so an object asked of
    one cannot come (a pipeline's stage metadata is made from stage 0's own, pipeline_ranks.py,
    without asking); one clear error instead of unpickling the empty buffer a fake group
    leaves."""

    @functools.wraps(recv_object_list)
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ExplorerError(
            f"--model-ranks {world_size()}: rank 0 asked another rank for a Python object "
            "(dist.recv_object_list), but a modeled job runs rank 0 alone and its copies "
            "send nothing: run this job as a real torchrun job (in shapes-only mode for a "
            "large model)"
        )

    return refuse


def fake_group(opts: Any) -> Any:
    """The process group of a modeled job: no data moves (torch's FakeProcessGroup)."""
    import torch

    c10d: Any = torch._C._distributed_c10d  # its stubs lag the runtime's signatures
    fake = c10d.FakeProcessGroup
    return fake._create_internal(opts.group_rank, opts.group_size, fake.Options())


def completed(result: Any) -> Any:
    """A c10d op's (tensors, Work) result in a modeled job: its Work a completed one whose
    future holds the tensors, as gloo's does (DDP's communication hook reads the future's
    value; FakeProcessGroup's has none)."""
    if type(result) is not tuple or len(result) != 2 or not world_size():
        return result
    import torch

    c10d: Any = torch._C._distributed_c10d
    tensors, work = result
    if not isinstance(work, torch.ScriptObject):
        return result
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(tensors if type(tensors) is list else [tensors])
    return tensors, c10d._create_work_from_future(future).boxed()


def manifest() -> dict[str, Any] | None:
    """What a profile of a modeled job says about its ranks, None when not modeling one."""
    from neuron_explorer.backend import pipeline_ranks

    n = world_size()
    if not n:
        return None
    out: dict[str, Any] = {"world_size": n, "executed": [0], "copies": list(range(1, n))}
    if pipeline_ranks.last_step:
        out["pipeline"] = dict(pipeline_ranks.last_step)
    return out
