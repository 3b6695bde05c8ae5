"""Savings by replay on a compiled mixture-of-experts model captured on the neuron device (the
shape of issue 26's DeepSeek-V3 report, small): a step whose device is busy a third of the time
must not be promised more than that by any finding, and a replayed finding's saving is the
replayed steps' drop."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one capture with torch.compile (~20 s)

SCRIPT = """
import sys, torch, torch.nn as nn, neuron_explorer
out = sys.argv[1]
torch.manual_seed(0)

class MoE(nn.Module):
    # a token-choice mixture of experts (DeepSeek-style shared + routed experts), dense
    # dispatch: every expert sees every token, weighted by the router's top-k gates
    def __init__(self, d=64, experts=8, k=2):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d)) for _ in range(experts))
        self.shared = nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))
        self.k = k
    def forward(self, x):
        gates = self.router(x).softmax(-1)
        top, idx = gates.topk(self.k, dim=-1)
        mask = torch.zeros_like(gates).scatter(-1, idx, top)
        out = self.shared(x)
        for i, e in enumerate(self.experts):
            out = out + mask[..., i:i + 1] * e(x)
        return out

model = nn.Sequential(MoE(), nn.LayerNorm(64), MoE()).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
step = torch.compile(model, backend="neuron")
x = torch.randn(4, 16, 64).to("neuron")
with neuron_explorer.profile(out, wait=0, warmup=1, active=3) as prof:
    for _ in range(4):
        loss = step(x).pow(2).mean()
        loss.backward()
        opt.step(); opt.zero_grad()
        prof.step()
"""


DEVICE_SIDE = ("memory-bound-op", "small-dma", "tensor-engine-padding", "fp32-matmul",
               "collective-share")  # fmt: skip


@pytest.fixture(scope="module")
def moe():
    from neuron_explorer.model.profile import Profile

    out = Path(tempfile.mkdtemp(prefix="moe-")) / "profile"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Profile.open(out)


def test_no_saving_exceeds_the_device_busy_time(moe):
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.analysis.context import context

    findings = run_rules(moe)
    ctx = context(moe)
    with ctx.lock:
        busy = int(ctx.one("SELECT coalesce(sum(e - s), 0) AS ns FROM busy")["ns"])
        steps = ctx.total_step_ns
    assert findings and busy < 0.6 * steps  # the device idles most of the step
    for f in findings:
        # a fix of device work gives back at most the device's busy time; a host-side fix
        # (fewer launches, no syncs) at most the steps
        bound = busy if f.rule in DEVICE_SIDE else steps
        assert f.saving_ns <= bound, (f.rule, f.saving_ns, bound)
    replayed = [f for f in findings if f.replayed]
    assert replayed, [f.rule for f in findings]


def test_critical_path_of_the_compiled_step(moe):
    from neuron_explorer.analysis.critical_path import critical_path

    page = critical_path(moe)
    assert page.path_ns == page.step_ns
    assert page.by_category["host"] > page.by_category["device compute"]  # host-bound
