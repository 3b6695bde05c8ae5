"""The `neuron` torch.distributed backend: `init_process_group("neuron")`.

Data moves between processes through gloo on the neuron tensors' host payloads (so results equal
a gloo run on the CPU); runtime/collectives.py runs each collective and, while a profiler
records, models its device cost. The backend serves CPU tensors too (gloo), so object
collectives and `backend="cpu:gloo,neuron:neuron"` both work.
"""

from __future__ import annotations

from typing import Any

_stores: dict[str, Any] = {}  # group name -> the store its neuron backend was created with


def _create(opts: Any, backend_options: Any) -> Any:
    from torch.distributed import ProcessGroupGloo

    _stores[opts.group_id] = opts.store
    return ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def store_of(group_name: str) -> Any:
    """The store of a group whose neuron backend this process created, else None."""
    return _stores.get(group_name)


def register() -> None:
    """Make "neuron" a torch.distributed backend for neuron and CPU tensors (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available() or "NEURON" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("neuron", _create, extended_api=True, devices=["neuron", "cpu"])
