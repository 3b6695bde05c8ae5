"""Train a small GPT-style language model in eager mode on the neuron device.

Known problem for the analysis: the step is launch-bound. Each of the many small eager ops
costs a launch on the host while its kernel is tiny, so the device sits idle between kernels;
the fp32 matmuls with dims far below 128 also waste most of each TensorE tile.
"""

from __future__ import annotations

import torch
from models import TinyGPT, lm_loss, pick_device, sample_args, token_batch


def main() -> None:
    args = sample_args(__doc__.splitlines()[0], steps=6, batch=8, seq=32)
    device = pick_device(args.device)
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    model = TinyGPT().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    for _ in range(args.steps):
        tokens = token_batch(args.batch, args.seq, 256, data).to(device)
        logits = model(tokens[:, :-1])
        loss = lm_loss(logits, tokens[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"gpt_train: {args.steps} steps on {device}, final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
