"""Record a small real torch.profiler trace: a tiny MLP training loop on CPU.

Run `.venv/bin/python samples/record_trace.py` to regenerate
samples/traces/cpu_mlp_train.pt.trace.json.gz (record_shapes, with_stack, profile_memory, a
schedule with 3 active steps). `record(path, ...)` is also used by the tests and benchmarks.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "traces" / "cpu_mlp_train.pt.trace.json.gz"


def build_model(width: int, depth: int):  # a torch module
    import torch

    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def train_step(model, optimizer, x, y) -> float:  # torch objects
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def record(
    out: Path,
    *,
    active: int = 3,
    width: int = 64,
    depth: int = 2,
    batch: int = 32,
    with_stack: bool = True,
    profile_memory: bool = True,
    repeat: int = 1,
) -> Path:
    """Train the MLP under torch.profiler and write the trace (gzipped if `out` ends in .gz)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = build_model(width, depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, width)
    y = torch.randint(0, 10, (batch,))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=True,
            with_stack=with_stack,
            profile_memory=profile_memory,
            schedule=schedule(wait=1, warmup=1, active=active, repeat=repeat),
            on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
        ) as prof:
            for _ in range((2 + active) * repeat):
                with torch.profiler.record_function("train_step"):
                    train_step(model, optimizer, x, y)
                prof.step()
        if out.suffix == ".gz":
            with raw.open("rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.move(raw, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--active", type=int, default=3)
    args = parser.parse_args()
    path = record(args.out, active=args.active)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
