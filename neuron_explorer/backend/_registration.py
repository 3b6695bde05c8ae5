"""Registers `neuron` with PyTorch through the PrivateUse1 dispatch key (docs/architecture.md)."""

from __future__ import annotations

import threading

_lock = threading.RLock()  # re-entered when `import torch` below runs the autoload hook
_registered = False


def register() -> None:
    """Rename PrivateUse1 to `neuron`, install the device module, guard, hooks and factory ops.

    Idempotent; safe to call from the autoload hook and from `import neuron_explorer.backend`.
    """
    global _registered
    with _lock:
        if _registered:
            return
        import torch

        if _registered:  # `import torch` just ran the autoload hook, which registered
            return

        from neuron_explorer.backend import device_module, tensor
        from neuron_explorer.backend.runtime import guard

        if torch._C._get_privateuse1_backend_name() != "neuron":
            torch.utils.rename_privateuse1_backend("neuron")
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
        torch._register_device_module("neuron", device_module)
        guard.install()
        from neuron_explorer.backend.runtime import dispatch, events, hostcost

        hostcost.NATIVE = guard.native  # the exact round trip's clock, none with the Python guard
        hostcost.FREES = guard.watch_frees(tensor.NeuronTensor)  # the wrapper's frees, timed
        events.ON_DRAIN.append(hostcost.pause)  # a drained capture: its record callback goes off

        tensor.set_device_object(torch.device("neuron", 0), dispatch.dispatch, dispatch.record_sync,
                                 dispatch.torch_dispatch)  # fmt: skip
        guard.fast_attrs(tensor.NeuronTensor)  # torch's lookups of its two dunders, in C
        from neuron_explorer.backend.runtime import factories

        factories.register_library_impls()
        from neuron_explorer.backend.runtime import whole_ops

        whole_ops.register()
        from neuron_explorer.backend.runtime import autocast, gcpause, handoff, holders, memory

        autocast.register()
        # A program that never makes a device tensor runs as without the package: its backward,
        # collections and optimizer steps go through none of ours (issue 28)
        memory.ON_FIRST_USE.extend((holders.install, gcpause.install, handoff.install))
        from neuron_explorer.backend import distributed, library_kernels, serialization, swap

        distributed.register()
        library_kernels.register()  # transformers' MoE grouped matmul, by name (no import)
        serialization.install()
        swap.install()  # module.to("neuron") while a CPU graph holds its parameters
        from neuron_explorer.backend.runtime import kineto_plugin

        kineto_plugin.install()  # the device in torch.profiler's own output, where g++ exists
        _registered = True


def is_registered() -> bool:
    return _registered
