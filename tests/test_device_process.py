"""The device as a fresh process sees it: autoload on `import torch`, opt-out, and failures that
must never take the process down."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, env=full_env, cwd=ROOT / "tests",
    )  # fmt: skip


def test_plain_import_torch_registers_the_device_and_backward_errors_do_not_abort():
    # one process for both: a torch import costs seconds on a busy machine
    r = _python(
        """
        import sys, torch

        x = torch.randn(3, device="neuron", requires_grad=True)
        from backend.runtime import guard
        print(x.device, "backend" in sys.modules, guard.kind, torch.neuron.device_count())

        class Boom(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                raise ValueError("boom-in-backward")

        for _ in range(2):
            try:
                Boom.apply(x).sum().backward()
            except ValueError as e:
                print("caught", e)
        (x * 3).sum().backward()
        print("alive", x.grad.cpu().tolist() == [3.0, 3.0, 3.0])
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
    )
    # the process must also exit cleanly (the Python-only guard can abort at exit here)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["neuron:0", "True", "native", "1", "caught", "boom-in-backward",
                                "caught", "boom-in-backward", "alive", "True"]  # fmt: skip
    assert "Warning" not in r.stderr


def test_autoload_off_leaves_torch_alone_until_import_backend_and_the_python_guard_works():
    r = _python(
        """
        import sys, torch
        assert "backend" not in sys.modules
        try:
            torch.randn(2, device="neuron")
        except RuntimeError as e:
            print("refused")
        import backend
        from backend.runtime import guard
        x = torch.randn(2, 3, device="neuron", requires_grad=True)
        (x @ x.t()).sum().backward()
        print(x.device, guard.kind, x.grad.shape == x.shape)
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        NEURON_PYTHON_GUARD="1",  # the fallback when no C++ compiler is found
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "neuron:0", "python", "True"]


def test_a_failing_registration_warns_and_import_torch_still_works():
    r = _python(
        """
        import sys, types
        broken = types.ModuleType("backend._registration")
        def register():
            raise RuntimeError("registration exploded")
        broken.register = register
        sys.modules["backend._registration"] = broken
        import torch
        print("imported", torch.ones(1).item())
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["imported", "1.0"]
    assert "neuron device not registered" in r.stderr
