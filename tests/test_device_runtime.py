"""The runtime's bookkeeping on real runs: compile counters after resets, fallback warnings at
the user's line, and what a run that dies inside an op leaves in its profile (issue 11)."""

from __future__ import annotations

import torch

import neuron_explorer.backend as backend


def _compiled_linear_twice(model):
    f = torch.compile(model, backend="neuron", dynamic=False)
    f(torch.randn(2, 4, device="neuron"))
    f(torch.randn(3, 4, device="neuron"))  # a new batch size: a recompile


def test_recompile_counted_after_dynamo_reset_and_stats_reset():
    model = torch.nn.Linear(4, 4).to("neuron")
    torch._dynamo.reset()
    backend.reset_compile_stats()
    _compiled_linear_twice(model)
    first = backend.compile_stats()
    assert (first.graph_compiles, first.graph_recompiles) == (2, 1)
    torch._dynamo.reset()
    backend.reset_compile_stats()
    assert backend.compile_stats().graph_recompiles == 0
    _compiled_linear_twice(model)  # the same graph and shapes as before the reset
    again = backend.compile_stats()
    assert (again.graph_compiles, again.graph_recompiles) == (2, 1)
