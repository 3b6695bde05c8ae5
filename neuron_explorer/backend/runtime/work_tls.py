"""What a gloo Work keeps of the thread that issued it: no Python object.

Every `backward()` stashes a Python object in the autograd thread-local state
(`torch.autograd.graph._engine_run_backward`: `_stash_obj_in_tls("context",
contextvars.copy_context())`, for torch.compile's config). The graph task copies that state to
the neuron device's autograd thread (the device's backward runs there, not on the caller's), so
DDP's bucket all-reduces reach runtime/collectives.py with it. gloo's `AsyncWork` copies the
issuing thread's state (`AsyncWork::tls_`, and a profiled Work's record-function callbacks), and
once backward has ended a finished Work holds the last reference to that `SafePyObject`: gloo's
run loop drops the Work and waits for the GIL to release the context. When the process group is
freed with the GIL held (a DDP model, a local of the script's main(), freed as main() returns:
`~Reducer` -> `~ProcessGroupGloo` joins the run loop), neither thread can go on: the rank hangs
(gdb: `take_gil` under `SafePyObject` under `~ThreadLocalState` under `~AsyncWork` in
`ProcessGroupGloo::runLoop`, while the main thread waits in `std::thread::join`). The context is
left out of the state for the host call that makes the Work, and put back after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_STASHED = "context"  # the key torch.autograd.graph's backward stashes


def without_python_tls(call: Callable[..., Any]) -> Callable[..., Any]:
    """`call` run with the backward's stashed Python context out of the thread-local state, so
    that a Work it creates holds no Python object (its release would need the GIL)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch._C._is_key_in_tls(_STASHED):
            return call(*args, **kwargs)
        context = torch._C._get_obj_in_tls(_STASHED)
        torch._C._remove_obj_from_tls(_STASHED)
        try:
            return call(*args, **kwargs)
        finally:
            torch._C._stash_obj_in_tls(_STASHED, context)

    return run
