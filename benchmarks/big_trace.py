"""Write a large torch.profiler (Kineto) trace of a CUDA training run, for web_big_bench.py:
what a `profile(activities=[CPU, CUDA], with_stack=True, profile_memory=True)` trace holds, at
about the size asked for (default 1 GB of JSON, about 3 million events). Kept in
benchmarks/data/ (ignored by git); never commit it.

    .venv/bin/python benchmarks/big_trace.py [--mb 1000] [--out PATH]

`write_ranks(folder, n, mb)` writes the n rank files of one job instead (import_bench --ranks).

Each step: a ProfilerStep span; Python frames (train.py -> module.py -> linear.py) around
framework ops (aten::linear -> aten::addmm, aten::relu, an NCCL all_reduce), each op launching
a CUDA kernel (cudaLaunchKernel, a flow to the kernel on stream 7), a memcpy, and `[memory]`
samples as the ops allocate and free; thread_name / process_name metadata name the lanes.
Times follow a fixed seed, so two runs write the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
PID, TID, STREAM, NCCL_STREAM = 4242, 4242, 7, 20
LAYERS = 24
FRAMES = (("train.py(41): train_step", None), ("torch/nn/modules/module.py(1778): _wrapped_call_impl", None),
          ("model.py(88): forward", None))  # fmt: skip
KERNELS = {
    "aten::addmm": "ampere_sgemm_128x64_tn",
    "aten::relu": "void at::native::vectorized_elementwise_kernel<4, at::native::relu>",
    "aten::add_": "void at::native::elementwise_kernel<128, 2, add>",
}


class Writer:
    """Events streamed to a JSON file, one per line, with ids and flows numbered here."""

    def __init__(self, path: Path, distributed: dict | None = None) -> None:
        self.f = path.open("w", encoding="utf-8")
        info = f'"distributedInfo": {json.dumps(distributed)}, ' if distributed else ""
        self.f.write('{"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": '
                     f'1700000000000000000, {info}"traceEvents": [\n')  # fmt: skip
        self.first = True
        self.python_id = 0
        self.flow = 0
        self.events = 0

    def put(self, ev: dict) -> None:
        self.f.write(("" if self.first else ",\n") + json.dumps(ev, separators=(",", ":")))
        self.first = False
        self.events += 1

    def span(self, cat: str, name: str, ts: float, dur: float, tid: int = TID, pid: int = PID,
             **args: object) -> None:  # fmt: skip
        self.put({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                  "ts": round(ts, 3), "dur": round(dur, 3), "args": args})  # fmt: skip

    def python(self, name: str, ts: float, dur: float, parent: int) -> int:
        self.python_id += 1
        self.span("python_function", name, ts, dur, **{"Python id": self.python_id,
                  "Python parent id": parent, "Python thread": 0})  # fmt: skip
        return self.python_id

    def launch(self, op_ts: float, kernel: str, gpu_ts: float, gpu_dur: float, stream: int) -> None:
        self.flow += 1
        corr = self.flow
        self.span("cuda_runtime", "cudaLaunchKernel", op_ts, 4.0, correlation=corr)
        self.put({"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": round(op_ts, 3),
                  "cat": "ac2g", "name": "ac2g"})  # fmt: skip
        self.span("kernel", kernel, gpu_ts, gpu_dur, tid=stream, pid=0, device=0, stream=stream,
                  correlation=corr, grid=[128, 1, 1], block=[256, 1, 1])  # fmt: skip
        self.put({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": round(gpu_ts, 3),
                  "cat": "ac2g", "name": "ac2g", "bp": "e"})  # fmt: skip

    def memory(self, ts: float, nbytes: int, total: int) -> None:
        self.put({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID,
                  "tid": TID, "ts": round(ts, 3), "args": {"Device Type": 1, "Device Id": 0,
                  "Addr": 1 << 32, "Bytes": nbytes, "Total Allocated": total,
                  "Total Reserved": 1 << 31}})  # fmt: skip

    def close(self) -> None:
        for tid, name in ((TID, "python"), (STREAM, "stream 7"), (NCCL_STREAM, "stream 20 (nccl)")):
            self.put({"ph": "M", "name": "thread_name", "pid": PID if tid == TID else 0,
                      "tid": tid, "args": {"name": name}})  # fmt: skip
        self.put(
            {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python3"}}
        )
        self.f.write("\n]}\n")
        self.f.close()


def step(w: Writer, n: int, ts: float, rnd: random.Random) -> float:
    """One training step from `ts` (us); returns its end."""
    layer_us = 60.0
    dur = 40 + LAYERS * layer_us + 60
    w.span("user_annotation", f"ProfilerStep#{n}", ts, dur)
    parent = 0
    t = ts + 2
    for i, (frame, _) in enumerate(FRAMES):
        parent = w.python(frame, t + i, dur - 4 - 2 * i, parent)
    t = ts + 10
    gpu = ts + 30
    total = 1 << 28
    for layer in range(LAYERS):
        lin = w.python("torch/nn/modules/linear.py(125): forward", t, 30, parent)
        w.span("cpu_op", "aten::linear", t + 1, 28, **{"Input Dims": [[64, 1024], [1024, 1024]]})
        for name, at, d in (("aten::addmm", 2, 20), ("aten::relu", 24, 6)):
            w.span("cpu_op", name, t + at, d)
            k = 20 + rnd.random() * 10 if name == "aten::addmm" else 4 + rnd.random()
            w.launch(t + at + 1, KERNELS[name], gpu, k, STREAM)
            gpu += k + 1
            total += 1 << 20
            w.memory(t + at + 0.5, 1 << 20, total)
        w.python(f"model.py({90 + layer % 4}): forward", t + 31, 20, lin)
        w.span("cpu_op", "aten::add_", t + 32, 12)
        w.launch(t + 33, KERNELS["aten::add_"], gpu, 3 + rnd.random(), STREAM)
        gpu += 5
        total -= 1 << 20
        w.memory(t + 40, -(1 << 20), total)
        t += layer_us
    w.span("cpu_op", "c10d::allreduce_", t, 20)
    w.launch(t + 2, "ncclKernel_AllReduce_RING_LL_Sum_float", gpu, 80, NCCL_STREAM)
    w.span("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", gpu + 82, 6, tid=STREAM, pid=0,
           device=0, stream=STREAM)  # fmt: skip
    return ts + dur + 40


def write(path: Path, mb: int, distributed: dict | None = None) -> tuple[int, float]:
    """Write a trace of about `mb` MB at `path` (`distributed`: its distributedInfo); returns
    (events, seconds)."""
    t0 = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    w = Writer(path, distributed)
    rnd = random.Random(0)
    ts, n = 1000.0, 1
    while w.f.tell() < mb * 1_000_000:
        ts = step(w, n, ts, rnd)
        n += 1
    w.close()
    return w.events, time.perf_counter() - t0


def write_ranks(folder: Path, n: int, mb: int) -> list[Path]:
    """The `n` rank files of one data-parallel job, about `mb` MB each, in `folder`
    (rank_00000.pt.trace.json...): rank 0's trace, and copies of it under each other rank's
    distributedInfo (the same steps at the same times, as a data-parallel job's ranks run them)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"rank_{k:05d}.pt.trace.json" for k in range(n)]
    write(paths[0], mb, {"backend": "nccl", "rank": 0, "world_size": n})
    with paths[0].open("rb") as first:
        head = first.readline()
        for k, path in enumerate(paths[1:], 1):
            first.seek(len(head))
            with path.open("wb") as out:
                out.write(head.replace(b'"rank": 0,', f'"rank": {k},'.encode(), 1))
                shutil.copyfileobj(first, out, 1 << 24)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or DATA / f"cuda_{args.mb}mb.pt.trace.json"
    events, s = write(out, args.mb)
    print(f"{out}: {events:,} events, {out.stat().st_size / 1e6:.0f} MB in {s:.0f} s")


if __name__ == "__main__":
    main()
