"""Advice that survives being applied: for each rule whose fix can be applied mechanically, a
tiny real model is captured on the neuron device before and after the fix, and the saving the
rule predicted on the first capture is checked, in sign and rough size, against what the
second capture measures.

Fixes covered: autocast / a bf16 model (fp32-matmul), a multi-tensor optimizer
(unfused-optimizer), DataLoader(drop_last=True) and padding to a fixed shape (recompilation),
building a per-step constant once on the device (host-device-copies). Pinned memory is a GPU
fix (the neuron device's host memory is all "pinned", guard.cpp) and has no capture here.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from neuron_explorer.analysis import get_rule
from neuron_explorer.model.profile import Profile

pytestmark = pytest.mark.slow  # each case captures two or three small models (seconds each)

ROUGH = (0.5, 2.0)  # predicted / measured must fall inside this band


def capture(steps: Callable[[int], None], n: int = 3, warm: int = 2) -> Profile:
    """Run `steps(i)` for `warm` unrecorded steps and `n` recorded ones on the neuron device."""
    import neuron_explorer

    out = Path(tempfile.mkdtemp(prefix="fix-")) / "profile"
    with neuron_explorer.profile(out, wait=warm - 1, warmup=1, active=n) as prof:
        for i in range(warm + n):
            steps(i)
            prof.step()
    return Profile.open(out)


def one(profile: Profile, sql: str) -> int:
    return int(profile.duckdb().execute(sql).fetchone()[0] or 0)


def kernel_ns(profile: Profile, ops: tuple[str, ...] | None = None) -> int:
    which = "" if ops is None else " AND op_name IN (" + ", ".join(f"'{o}'" for o in ops) + ")"
    return one(
        profile,
        "SELECT sum(dur_ns) FROM events WHERE layer = 'device' AND kind = 'kernel'"
        f" AND step IS NOT NULL{which}",
    )


def assert_rough(predicted: float, measured: float) -> None:
    assert measured != 0 and (predicted > 0) == (measured > 0), (predicted, measured)
    ratio = predicted / measured
    assert ROUGH[0] <= ratio <= ROUGH[1], f"predicted {predicted:.0f} vs measured {measured:.0f}"


# fp32-matmul: autocast, or a bf16 model ------------------------------------------------------

MATMULS = ("aten::mm", "aten::addmm")


@functools.cache
def mlp_capture(mode: str) -> Profile:
    """3 Linear+GELU layers (256 wide, batch 256) trained with AdamW(foreach=True): in float32,
    under torch.autocast to bf16, or with the model and input cast to bf16."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(3)))
    model = model.to("neuron")
    x = torch.randn(256, 256).to("neuron")
    if mode == "bf16":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step(_: int) -> None:
        with torch.autocast("neuron", dtype=torch.bfloat16, enabled=mode == "autocast"):
            y = model(x)
        loss = y.float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return capture(step)


def test_fp32_matmul_predicts_what_autocast_and_a_bf16_model_measure():
    before = mlp_capture("fp32")
    (f,) = get_rule("fp32-matmul").evaluate(before)
    m = f.evidence.metrics
    # autocast: the casts it adds cost more than these small matmuls gain, as measured
    autocast = mlp_capture("autocast")
    measured_autocast = kernel_ns(before) - kernel_ns(autocast)
    assert_rough(m["autocast_net_ns"], measured_autocast)
    assert measured_autocast < 0 and "model.to(torch.bfloat16)" in f.fix
    # so the fix offered is the bf16 model, whose matmul saving is the one claimed
    bf16 = mlp_capture("bf16")
    assert_rough(f.saving_ns, kernel_ns(before, MATMULS) - kernel_ns(bf16, MATMULS))
    assert kernel_ns(before) - kernel_ns(bf16) >= 0.5 * f.saving_ns  # the step's kernels too
    assert get_rule("fp32-matmul").evaluate(bf16) == []  # fixed: nothing left to report
