"""Train a small regression MLP with a robust loss, three porting mistakes included.

Known problems for the analysis: (1) a CPU fallback: the loss clips residuals at their median
(torch.median is outside the neuron device's supported ops), so every step copies the residuals
to the host and back (the backward of abs and minimum falls back too); (2) a float64 tensor: the per-feature scale is created as float64, which
the device computes as float32 with a warning; (3) a host sync: `loss.item()` in the loop makes
the host wait for the device at the end of every step. All three are porting problems, ranked
first (readiness). While the eager step is launch-bound the sync's wait is short (the device has
already drained), and the analysis shows that small measured cost; it grows once the step is
fused and the device is the bottleneck.
The optimizer is the multi-tensor one (foreach=True) so that no unrelated problem (a per-parameter
update) crowds the known ones.
"""

from __future__ import annotations

import torch
from models import pick_device, sample_args
from torch import nn


def main() -> None:
    args = sample_args(__doc__.splitlines()[0], steps=6, batch=64, features=32)
    device = pick_device(args.device)
    torch.manual_seed(0)
    x = torch.randn(args.batch * args.steps, args.features)
    y = x @ torch.randn(args.features, 1) + 0.1 * torch.randn(args.batch * args.steps, 1)
    scale = torch.linspace(0.5, 1.5, args.features, dtype=torch.float64).to(device)
    model = nn.Sequential(nn.Linear(args.features, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=True)
    losses = []
    for step in range(args.steps):
        xb = x[step * args.batch : (step + 1) * args.batch].to(device)
        yb = y[step * args.batch : (step + 1) * args.batch].to(device)
        pred = model(xb * scale.float())
        residual = (pred - yb).abs()
        cap = residual.median()  # outside the supported set: runs on the CPU
        loss = torch.minimum(residual, 2 * cap).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # a host sync every step
    print(f"fallback_float64: {args.steps} steps on {device}, final loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
