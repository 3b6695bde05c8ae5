"""Train the small GPT under torch.compile(backend="neuron", dynamic=False), changing the
sequence length once.

Known problem for the analysis: a recompile. The graph is compiled for the first sequence
length, then the length changes once (--switch-at), so torch.compile compiles the graph again
for the new shape; compile time dwarfs the steady-state steps around it.
"""

from __future__ import annotations

import torch
from models import TinyGPT, lm_loss, pick_device, sample_args, token_batch


def main() -> None:
    args = sample_args(
        __doc__.splitlines()[0], steps=6, batch=8, seq=32, seq2=48, switch_at=3, layers=2
    )
    device = pick_device(args.device)
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    model = TinyGPT(layers=args.layers).to(device)
    # Without the neuron device, "eager" keeps the compile path (and the recompile) cheap.
    backend = "neuron" if device.type == "neuron" else "eager"
    compiled = torch.compile(model, backend=backend, dynamic=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    for step in range(args.steps):
        seq = args.seq if step < args.switch_at else args.seq2  # the deliberate shape change
        tokens = token_batch(args.batch, seq, 256, data).to(device)
        logits = compiled(tokens[:, :-1])
        loss = lm_loss(logits, tokens[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"gpt_compile: {args.steps} steps on {device}, final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
