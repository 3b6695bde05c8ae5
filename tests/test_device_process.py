"""The device as a fresh process sees it: autoload on `import torch`, opt-out, and failures that
must never take the process down."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, env=full_env, cwd=ROOT / "tests",
    )  # fmt: skip


# An exception raised inside backward on the device, twice, then more training: the error must
# reach the caller as a plain Python exception and the process must go on and exit cleanly.
_BACKWARD_ERRORS = """
    import sys, torch

    x = torch.randn(3, device="neuron", requires_grad=True)
    from neuron_explorer.backend.runtime import guard
    print(x.device, "neuron_explorer.backend" in sys.modules, guard.kind, torch.neuron.device_count())

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise ValueError("boom-in-backward")

    class BadKernel(torch.autograd.Function):  # the error comes from a device kernel
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad + torch.ones(4, device="neuron")

    for _ in range(2):
        try:
            Boom.apply(x).sum().backward()
        except ValueError as e:
            print("caught", e)
    try:
        BadKernel.apply(x).sum().backward()
    except RuntimeError as e:
        print("kernel", "must match the size" in str(e))
    (x * 3).sum().backward()
    print("alive", x.grad.cpu().tolist() == [3.0, 3.0, 3.0])
"""
_EXPECTED = ["caught", "boom-in-backward", "caught", "boom-in-backward", "kernel", "True",
             "alive", "True"]  # fmt: skip


@pytest.mark.slow  # a fresh interpreter with torch: ~5 s
def test_plain_import_torch_registers_the_device_and_backward_errors_do_not_abort():
    # one process for both: a torch import costs seconds on a busy machine
    r = _python(_BACKWARD_ERRORS, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    # the process must also exit cleanly (the Python-only guard can abort at exit here)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["neuron:0", "True", "native", "1", *_EXPECTED]
    assert "Warning" not in r.stderr


@pytest.mark.slow  # two fresh interpreters with torch: ~12 s
def test_the_python_guard_also_surfaces_backward_errors_without_aborting():
    # the fallback without g++: the same script, then one where the backward error is the last
    # thing the process does (uncaught), so it exits while autograd's device thread cleans up
    r = _python(_BACKWARD_ERRORS, TORCH_DEVICE_BACKEND_AUTOLOAD="1", NEURON_PYTHON_GUARD="1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["neuron:0", "True", "python", "1", *_EXPECTED]
    r = _python(
        """
        import torch

        class Boom(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                raise ValueError("boom-at-exit")

        x = torch.randn(256, device="neuron", requires_grad=True)
        torch.stack([Boom.apply(x).exp() for _ in range(50)]).sum().backward()
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        NEURON_PYTHON_GUARD="1",
    )
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # a traceback, not a signal
    assert "ValueError: boom-at-exit" in r.stderr


@pytest.mark.slow  # a fresh interpreter with torch: ~6 s
def test_autoload_off_leaves_torch_alone_until_import_backend_and_the_python_guard_works():
    r = _python(
        """
        import sys, torch
        assert "neuron_explorer.backend" not in sys.modules
        try:
            torch.randn(2, device="neuron")
        except RuntimeError as e:
            print("refused")
        from neuron_explorer import backend
        from neuron_explorer.backend.runtime import guard
        x = torch.randn(2, 3, device="neuron", requires_grad=True)
        (x @ x.t()).sum().backward()
        print(x.device, guard.kind, x.grad.shape == x.shape)
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        NEURON_PYTHON_GUARD="1",  # the fallback when no C++ compiler is found
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "neuron:0", "python", "True"]


@pytest.mark.slow  # a fresh interpreter with torch: ~6 s
def test_a_program_that_never_uses_the_device_runs_through_none_of_its_hooks():
    # with autoload on, a CPU program's backward, collections and optimizer steps went through
    # the device's wrappers (issue 28); they now come with the first device tensor
    r = _python(
        """
        import gc, torch
        from torch.optim import optimizer
        def ours():
            return (torch.autograd._engine_run_backward.__module__.startswith("neuron_explorer"),
                    any("neuron_explorer" in getattr(c, "__module__", "") for c in gc.callbacks),
                    len(optimizer._global_optimizer_pre_hooks)
                    + len(optimizer._global_optimizer_post_hooks))
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        gc.collect()
        print(torch.neuron.is_available(), *ours())
        torch.ones(2, device="neuron")
        print(*ours())
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "False", "0", "True", "True", "2"]


def test_a_failing_registration_warns_and_import_torch_still_works():
    r = _python(
        """
        import sys, types
        broken = types.ModuleType("neuron_explorer.backend._registration")
        def register():
            raise RuntimeError("registration exploded")
        broken.register = register
        sys.modules["neuron_explorer.backend._registration"] = broken
        import torch
        print("imported", torch.ones(1).item())
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["imported", "1.0"]
    assert "neuron device not registered" in r.stderr


def test_the_exit_waits_until_autograds_device_thread_has_let_go_of_every_tensor():
    """At exit the device thread must hold no tensor that has a Python object (dropping one
    takes the GIL, which a finalizing interpreter answers by ending the thread: an abort). The
    exit hook queues one backward behind everything and returns once the thread let go of it."""
    import torch

    from neuron_explorer.backend.runtime import guard

    xs = [torch.zeros((), device="neuron", requires_grad=True) for _ in range(200)]
    grads = torch.autograd.grad(sum(x * 2.0 for x in xs), xs)
    assert guard._settle_device_thread()
    assert all(g._use_count() == 1 for g in grads)  # the earlier backward is cleaned up too
    # a tensor C++ still holds (x's gradient accumulator, in y's graph) is not let go of
    x = torch.zeros((), device="neuron", requires_grad=True)
    y = x * 1.0
    assert y.grad_fn is not None and not guard._wait_released([x], deadline=0)
