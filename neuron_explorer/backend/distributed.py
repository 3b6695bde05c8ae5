"""The `neuron` torch.distributed backend: `init_process_group("neuron")`.

Data moves between processes through gloo on the neuron tensors' host payloads (so results equal
a gloo run on the CPU); runtime/collectives.py runs each collective and, while a profiler
records, models its device cost. The backend serves CPU tensors too (gloo), so object
collectives and `backend="cpu:gloo,neuron:neuron"` both work.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from neuron_explorer.backend import after_import


def _create(opts: Any, backend_options: Any) -> Any:
    from torch.distributed import ProcessGroupGloo

    from neuron_explorer.backend import model_ranks
    from neuron_explorer.backend.runtime import collectives

    modeled = model_ranks.world_size() > 0
    if not modeled:  # a modeled job's ranks swap no arrival times: they are copies of one
        collectives.stores[opts.group_id] = opts.store
    _route_fsdp_when_imported()
    collectives.install_wait()
    _install_barrier()
    if modeled:
        return model_ranks.fake_group(opts)
    gloo = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    _GLOO[opts.group_id] = gloo  # freed when a group of that id is made again, or at exit
    return gloo


# The gloo backend of each group, held here so that freeing a DDP model (its reducer holds the
# last reference otherwise) never runs ~ProcessGroupGloo, which joins gloo's run loop with the
# GIL held, while that loop may be dropping a finished Work that needs the GIL: the Work's output
# is a neuron tensor's payload, a tensor with a Python object, which torch 2.13 takes the GIL to
# drop (gdb: take_gil under TensorImpl::decref_pyobject under ~AsyncWork in runLoop, the main
# thread in std::thread::join under ~Reducer). At exit Python stops a thread that waits for it.
# The Python object the backward stashes is kept out of each Work (runtime/work_tls.py).
_GLOO: dict[str, Any] = {}


def store_of(group_name: str) -> Any:
    """The store of a group whose neuron backend this process created, else None."""
    from neuron_explorer.backend.runtime import collectives

    return collectives.stores.get(group_name)


def _install_barrier() -> None:
    """Route `ProcessGroup.barrier` of a neuron group on the CPU (what `dist.barrier()` asks of a
    gloo group) through runtime/collectives.barrier, which models it (idempotent). A barrier on a
    neuron tensor (a group bound to a neuron device) reaches the dispatch and is modeled there."""
    from torch.distributed import ProcessGroup

    from neuron_explorer.backend.runtime import collectives

    if getattr(ProcessGroup.barrier, "_neuron", False):
        return
    original = ProcessGroup.barrier

    def barrier(self: Any, *args: Any, **kwargs: Any) -> Any:
        opts = kwargs.get("opts", args[0] if args else None)
        device = getattr(opts, "device", None)
        if collectives.group_store(self) is None or (device is not None and device.type != "cpu"):
            return original(self, *args, **kwargs)
        return collectives.barrier(self, lambda: original(self, *args, **kwargs))

    barrier._neuron = True  # type: ignore[attr-defined]
    ProcessGroup.barrier = barrier  # type: ignore[method-assign]


_FSDP_PARAM = "torch.distributed.fsdp._fully_shard._fsdp_param_group"


def _route_fsdp_when_imported() -> None:
    after_import.run_after(_FSDP_PARAM, _route_fsdp_storage)


_FSDP_MESH = "torch.distributed.fsdp._fully_shard._fully_shard"


def _default_mesh_follows_the_process_group() -> None:
    """fully_shard(model) with no mesh builds one on `torch._C._get_accelerator()`, which is
    `neuron` once the device is registered, even in a gloo program of CPU tensors that never
    names it (its first `tensor.data = tensor.to("neuron")` then failed). The default mesh is
    a CPU mesh where the default process group has no backend for the device, as it is without
    the package; a group that has one (backend="neuron") keeps the device mesh."""
    fully_shard_module = sys.modules.get(_FSDP_MESH)
    default_mesh = getattr(fully_shard_module, "_init_default_mesh", None)
    if default_mesh is None or getattr(default_mesh, "_neuron", False):
        return
    import torch.distributed as dist

    def init_default_mesh(mesh_dim_names: tuple[str, ...] | None = None) -> Any:
        if not dist.is_initialized():
            dist.init_process_group()
        config = dist.get_backend_config()  # "cpu:gloo,cuda:gloo"
        if "neuron" in {part.split(":", 1)[0] for part in config.split(",")}:
            return default_mesh(mesh_dim_names)
        from torch.distributed.device_mesh import init_device_mesh

        size = dist.get_world_size()
        return init_device_mesh("cpu", (size,), mesh_dim_names=mesh_dim_names)

    init_default_mesh._neuron = True  # type: ignore[attr-defined]
    fully_shard_module._init_default_mesh = init_default_mesh  # type: ignore[union-attr]


def _route_fsdp_storage() -> None:
    """FSDP2 frees an unsharded parameter by resizing its storage to 0 and gets it back by
    resizing it to full size; a neuron tensor is a wrapper whose bytes live in its payload, so
    resize the payload's storage there (other tensors go to FSDP's own functions). Giving the
    wrapper the payload's storage instead breaks torch.compile, whose fakeification reads it."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:  # a torch without FSDP2: nothing to route
        return
    if getattr(_fsdp_param.free_storage, "_neuron", False):
        return
    from neuron_explorer.backend.runtime import memory
    from neuron_explorer.backend.tensor import NeuronTensor

    free, alloc = _fsdp_param.free_storage, _fsdp_param.alloc_storage

    def free_storage(tensor: Any) -> None:
        if not isinstance(tensor, NeuronTensor):
            return free(tensor)
        if (storage := tensor._payload.untyped_storage()).size() != 0:
            before = storage.nbytes()
            storage.resize_(0)
            memory.resized(storage, before)
        return None

    def alloc_storage(tensor: Any) -> None:
        if not isinstance(tensor, NeuronTensor):
            return alloc(tensor)
        size = tensor.numel() * tensor.itemsize
        if (storage := tensor._payload.untyped_storage()).size() != size:
            before = storage.nbytes()
            storage.resize_(size)
            memory.resized(storage, before)
        return None

    free_storage._neuron = alloc_storage._neuron = True  # type: ignore[attr-defined]
    _fsdp_param.free_storage = free_storage
    _fsdp_param.alloc_storage = alloc_storage
    _fsdp_param_group.alloc_storage = alloc_storage


# the object collectives: pickled bytes in a tensor on `device` (torch.distributed.pipelining
# sends its stages' shapes so, on the stage's device)
_OBJECT_COLLECTIVES = ("send_object_list", "recv_object_list", "broadcast_object_list",
                       "all_gather_object", "gather_object", "scatter_object_list")  # fmt: skip


def _objects_through_the_host() -> None:
    """In shapes-only mode a neuron tensor holds no bytes, so a pickled object sent in one
    (`send_object_list(..., device="neuron")`) would arrive as zeros: its bytes go through the
    host instead (the backend serves CPU tensors through gloo), as they would be data on the
    chip. Idempotent; a no-op for any other device and outside the mode."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from neuron_explorer.backend.runtime import shapes

    for name in _OBJECT_COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_neuron", False):
            continue

        @functools.wraps(original)
        def on_host(*args: Any, _call: Any = original, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if shapes.enabled() and device is not None and torch.device(device).type == "neuron":
                kwargs["device"] = torch.device("cpu")
            return _call(*args, **kwargs)

        on_host._neuron = True  # type: ignore[attr-defined]
        setattr(c10d, name, on_host)
        setattr(dist, name, on_host)


def register() -> None:
    """Make "neuron" a torch.distributed backend for neuron and CPU tensors (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available() or "NEURON" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("neuron", _create, extended_api=True, devices=["neuron", "cpu"])
    after_import.run_after(_FSDP_MESH, _default_mesh_follows_the_process_group)
    _objects_through_the_host()
    from neuron_explorer.backend import model_ranks

    model_ranks.install()
