"""A synthetic neuron-shaped profile of any size, for the web benchmark and the web tests.

Each framework op on the host thread has a nested child op and a runtime launch; the launch's
flow id reaches a device kernel with engine instructions and DMA transfers under it. Built with
numpy, so a million events take a second or two.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

SOURCE_FILE = "/home/user/project/train.py"
SOURCE_TEXT = "\n".join(
    [
        "import torch",
        "# shown as text, never run: <b>markup</b> <script>window.__xss=4</script>",
        "",
        "class Model(torch.nn.Module):",
        "    def forward(self, x):",
        "        x = self.fc1(x)",
        "        x = torch.relu(x)",
        "        x = self.fc2(x)",
        "        return x.softmax(-1)",
        "",
        "",
        "def train_step(model, batch, opt):",
        "    loss = model(batch).sum()",
        "    loss.backward()",
        "    opt.step()",
        "",
    ]
)
# (op, child op, source line, engine of its instructions, flops per call)
OPS = (
    ("aten::linear", "aten::addmm", 6, "TensorE", 2 * 128 * 512 * 512),
    ("aten::relu", "aten::clamp_min", 7, "VectorE", 128 * 512),
    ("aten::linear", "aten::addmm", 8, "TensorE", 2 * 128 * 512 * 256),
    ("aten::softmax", "aten::_softmax", 9, "ScalarE", 5 * 128 * 256),
    ("aten::sum", "aten::sum_out", 13, "VectorE", 128 * 256),
)
INSTR_PER_KERNEL = 4
DMA_PER_KERNEL = 2
EVENTS_PER_OP = 4 + INSTR_PER_KERNEL + DMA_PER_KERNEL
OP_PERIOD_NS = 12_000


def make_profile(out: str | Path, n_events: int, *, op_name_prefix: str = "") -> Path:
    """Write a profile of about `n_events` events to `out` and return its path."""
    from neuron_explorer.model import Manifest, ProfileWriter, Step

    n_ops = max(len(OPS), n_events // EVENTS_PER_OP)
    ops_per_step = min(5000, max(len(OPS), n_ops // 4))
    n_steps = max(1, n_ops // ops_per_step)
    n_ops = n_steps * ops_per_step
    k = np.arange(n_ops)
    step = k // ops_per_step
    which = k % len(OPS)
    step_len = ops_per_step * OP_PERIOD_NS + 50_000
    t0 = step * step_len + 20_000 + (k % ops_per_step) * OP_PERIOD_NS

    names = np.array([op_name_prefix + o[0] for o in OPS], dtype=object)[which]
    child_names = np.array([o[1] for o in OPS], dtype=object)[which]
    lines = np.array([o[2] for o in OPS])[which]
    engines = np.array([o[3] for o in OPS], dtype=object)[which]
    flops = np.array([o[4] for o in OPS])[which]

    base = n_steps + k * EVENTS_PER_OP  # ids 0..n_steps-1 are the step spans
    op_id, child_id, launch_id, kernel_id = base, base + 1, base + 2, base + 3
    cols: dict[str, list[np.ndarray]] = {c: [] for c in _COLUMNS}

    def add(n, **values):
        for c in _COLUMNS:
            v = values.get(c)
            cols[c].append(np.full(n, v, dtype=object) if not isinstance(v, np.ndarray) else v)

    s = np.arange(n_steps)
    add(n_steps, id=s, layer="host", kind="step", name=np.array([f"ProfilerStep#{i}" for i in s], dtype=object),
        track="thread 1", device="cpu", start_ns=s * step_len, dur_ns=np.full(n_steps, step_len - 10_000),
        step=s)  # fmt: skip
    src = dict(src_file=SOURCE_FILE, src_line=lines, src_func="forward")
    add(n_ops, id=op_id, layer="host", kind="op", name=names, track="thread 1", device="cpu",
        start_ns=t0, dur_ns=np.full(n_ops, 9_000), parent_id=step, step=step, op_name=names,
        flops=flops, **src)  # fmt: skip
    add(n_ops, id=child_id, layer="host", kind="op", name=child_names, track="thread 1",
        device="cpu", start_ns=t0 + 1_000, dur_ns=np.full(n_ops, 7_000), parent_id=op_id,
        step=step, op_name=child_names, **src)  # fmt: skip
    add(n_ops, id=launch_id, layer="host", kind="runtime", name="neuron::launch", track="thread 1",
        device="cpu", start_ns=t0 + 5_000, dur_ns=np.full(n_ops, 2_000), parent_id=child_id,
        flow_id=k, step=step, op_name=child_names, **src)  # fmt: skip
    kstart = t0 + 7_000
    add(n_ops, id=kernel_id, layer="device", kind="kernel",
        name=np.array([f"kernel_{c.split('::')[-1]}" for c in child_names], dtype=object),
        track="kernels", device="neuron:0", start_ns=kstart, dur_ns=np.full(n_ops, 10_000),
        flow_id=k, step=step, op_name=child_names, flops=flops,
        bytes_read=np.full(n_ops, 262_144), bytes_written=np.full(n_ops, 131_072), **src)  # fmt: skip
    for j in range(INSTR_PER_KERNEL):
        add(n_ops, id=base + 4 + j, layer="device", kind="instruction",
            name=np.array([f"{e[:-1].lower()}.op{j}" for e in engines], dtype=object),
            track=engines, device="neuron:0", start_ns=kstart + 500 + j * 2_300,
            dur_ns=np.full(n_ops, 2_000), parent_id=kernel_id, step=step, op_name=child_names,
            **src)  # fmt: skip
    for j in range(DMA_PER_KERNEL):
        add(n_ops, id=base + 4 + INSTR_PER_KERNEL + j, layer="device", kind="dma",
            name="dma.hbm_to_sbuf", track=f"DMA q{j}", device="neuron:0",
            start_ns=kstart + j * 4_000, dur_ns=np.full(n_ops, 1_500), parent_id=kernel_id,
            step=step, op_name=child_names, bytes_read=np.full(n_ops, 65_536), **src)  # fmt: skip

    import pyarrow as pa

    table = {c: pa.array(np.concatenate(v).tolist()) for c, v in cols.items()}
    table["rank"] = pa.array(np.zeros(len(table["id"]), dtype=np.int32))
    ts = np.arange(0, n_steps * step_len, max(1, step_len // 8))
    counters = {
        "rank": np.zeros(len(ts), dtype=np.int32),
        "track": ["neuron:0"] * len(ts),
        "name": ["memory_allocated"] * len(ts),
        "ts_ns": ts,
        "value": (1e6 + (ts % step_len) * 10.0).astype(float),
        "unit": ["bytes"] * len(ts),
    }
    steps = tuple(Step(int(i), 0, int(i * step_len), int(step_len - 10_000)) for i in s)
    spec = {"name": "trn2", "peak_flops_bf16": 667e12, "memory_bytes_per_s": 1.4e12}
    with ProfileWriter(out) as w:
        w.write_events(table)
        w.write_table("counters", counters)
        w.add_source(SOURCE_FILE, SOURCE_TEXT)
        return w.commit(
            Manifest(source="capture", origin_unix_ns=1_700_000_000_000_000_000, steps=steps,
                     device_spec=spec, producer="benchmarks/web_synth.py")
        )  # fmt: skip


_COLUMNS = (
    "id", "layer", "kind", "name", "track", "device", "start_ns", "dur_ns", "parent_id",
    "flow_id", "step", "src_file", "src_line", "src_func", "op_name", "flops", "bytes_read",
    "bytes_written",
)  # fmt: skip


if __name__ == "__main__":
    print(make_profile(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000))
