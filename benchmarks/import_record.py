"""Record torch.profiler traces of a real model (a small Transformer encoder training loop on
CPU, record_shapes + with_stack + profile_memory) of about a given size, for import_bench.py.

    .venv/bin/python benchmarks/import_record.py --mb 10 100 [500]

Traces go to benchmarks/data/transformer_<N>mb.pt.trace.json (ignored by git).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
PROBE_STEPS = 4


def _model():  # a torch module
    import torch

    layer = torch.nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=128, batch_first=True
    )
    return torch.nn.Sequential(
        torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False),
        torch.nn.Linear(64, 10),
    )


def record(out: Path, steps: int) -> Path:
    """Train for `steps` profiled steps and write the uncompressed trace to `out`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16, 64)
    y = torch.randint(0, 10, (8, 16))
    out.parent.mkdir(parents=True, exist_ok=True)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=True,
        profile_memory=True,
        schedule=schedule(wait=1, warmup=1, active=steps),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
    ) as prof:
        for _ in range(steps + 2):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            prof.step()
    return out


def record_size(mb: int) -> Path:
    """Record a trace of about `mb` megabytes (sized from a short probe run)."""
    out = DATA / f"transformer_{mb}mb.pt.trace.json"
    with tempfile.TemporaryDirectory() as tmp:
        probe = record(Path(tmp) / "probe.json", PROBE_STEPS)
        per_step = probe.stat().st_size / PROBE_STEPS
    steps = max(1, round(mb * 1e6 / per_step))
    t0 = time.perf_counter()
    record(out, steps)
    size = out.stat().st_size
    print(f"{out.name}: {steps} steps, {size / 1e6:.1f} MB, {time.perf_counter() - t0:.0f} s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[10, 100])
    for mb in parser.parse_args().mb:
        record_size(mb)


if __name__ == "__main__":
    main()
