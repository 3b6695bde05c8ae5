"""Findings that were wrong on models tried as a new user would (issue 26), each on a real
capture of the situation: module paths under torch.compile, ..."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from neuron_explorer.model.profile import Profile

pytestmark = pytest.mark.slow  # each case captures a tiny model on the neuron device (seconds)


def capture(run: Callable[[], None]) -> Profile:
    """`run()` recorded whole, as one cycle, on the neuron device."""
    import neuron_explorer

    out = Path(tempfile.mkdtemp(prefix="wrong-")) / "profile"
    with neuron_explorer.profile(out):
        run()
    return Profile.open(out)


def kernel_modules(p: Profile) -> set[str]:
    rows = p.duckdb().execute(
        "SELECT DISTINCT CAST(module AS VARCHAR) FROM events WHERE layer = 'device'"
        " AND kind = 'kernel' AND module IS NOT NULL"
    )
    return {r[0] for r in rows.fetchall()}


# module paths under torch.compile ---------------------------------------------------------------


def test_compiled_kernels_name_modules_as_eager_does_whatever_the_model_is_called_through():
    # dynamo names a module from the compiled frame: L['self'] for a compiled model, but
    # L['model'] / L['args'][0] / G['m'] for a function given the model, and a submodule
    # compiled alone has paths relative to itself; eager names them from the model called
    import torch
    from torch import nn

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.h = nn.ModuleList([nn.Linear(16, 16)])
            self.ln = nn.LayerNorm(16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ln(self.h[0](x)).relu()

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

    def given(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x)

    def in_args(*args: torch.Tensor) -> torch.Tensor:
        return args[0](args[1])

    torch.manual_seed(0)
    x = torch.randn(4, 16).to("neuron")

    def modules(call: Callable[[Wrapper], torch.Tensor], wrap: bool = False) -> set[str]:
        w = Wrapper().to("neuron")
        if wrap:
            w.model = torch.compile(w.model, backend="neuron")  # type: ignore[assignment]
        return kernel_modules(capture(lambda: call(w).sum().backward()))

    eager = modules(lambda w: w(x))
    assert {"model.h.0", "model.ln"} <= eager, eager
    compiled = torch.compile(given, backend="neuron")
    spread = torch.compile(in_args, backend="neuron")
    for name, found in {
        "compiled model": modules(lambda w: torch.compile(w, backend="neuron")(x)),
        "function given the model": modules(lambda w: compiled(w, x)),
        "function given it in *args": modules(lambda w: spread(w, x)),
        "compiled submodule": modules(lambda w: w(x), wrap=True),
    }.items():
        assert {"model.h.0", "model.ln"} <= found, (name, found)
        assert not any(m.startswith(("L.", "G.", "h.", "ln")) for m in found), (name, found)
