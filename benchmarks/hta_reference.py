"""HTA's numbers for every GPU trace in tests/data/kineto-gpu, written to
tests/data/hta-reference/expected.json: the expected values of tests/test_hta_agreement.py.

    python benchmarks/hta_reference.py

makes a venv of its own (/tmp/hta-venv, HolisticTraceAnalysis 0.5.0, torch pinned so pip never
changes it) and reruns itself there: HTA is not a dependency of Neuron Explorer, its test only
reads the JSON. HTA runs with its nanosecond rounding turned off (HTA_DISABLE_NS_ROUNDING=1) and
its defaults otherwise (the last profiler step left out, as HTA's users see it). What is
recorded, per trace and rank, all times in integer ns (HTA's float microseconds times 1000,
rounded):
- streams: kernel count and summed duration per stream, of the GPU events HTA keeps;
- temporal: HTA's get_temporal_breakdown (idle, compute, non-compute, kernel window);
- kernel_types: get_gpu_kernel_breakdown with memory kernels (the union of each type's
  intervals, overlaps as HTA names them; HTA truncates each piece to whole microseconds);
- type_union_ns: the union of each kernel type's intervals by HTA's own merge_kernel_intervals
  and get_kernel_type, without that truncation;
- memory: Memcpy/Memset count and summed duration per HTA memory kernel type;
- top_kernels: the top 10 of each kernel type by summed time (sum, max, min, mean);
- window: the kernels HTA keeps as launched by CPU events before the last step starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HTA_VERSION = "0.5.0"
TORCH_PIN = "torch==2.13.0"
VENV = Path("/tmp/hta-venv")
ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "kineto-gpu"
OUT = ROOT / "tests" / "data" / "hta-reference" / "expected.json"
TOP_N = 10


def ensure_venv() -> Path:
    """The venv's python, with HTA installed (made once)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    ok = subprocess.run([str(python), "-c", "import hta"], capture_output=True).returncode == 0
    if not ok:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pin:
            pin.write(TORCH_PIN + "\n")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"holistictraceanalysis=={HTA_VERSION}",
             "-c", pin.name],
            check=True,
        )  # fmt: skip
    return python


def ns(us: float) -> int:
    return int(round(float(us) * 1000))


def analyse(trace: Path) -> dict | None:
    """HTA's numbers for one trace, or None when it has no GPU kernels."""
    from hta.common.trace_filter import GPUKernelFilter
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import get_kernel_type, get_memory_kernel_type, merge_kernel_intervals

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(trace, Path(d) / trace.name)
        analysis = TraceAnalysis(trace_dir=d)
    t = analysis.t
    sym = t.symbol_table.get_sym_table()
    ranks = {}
    for rank, df in t.traces.items():
        gpu = GPUKernelFilter()(df, t.symbol_table)
        gpu = gpu[gpu["stream"] >= 0].copy()
        if gpu.empty:
            return None
        gpu["kname"] = gpu["name"].map(lambda i: sym[i])
        gpu["ktype"] = gpu["kname"].map(get_kernel_type)
        streams = {
            str(int(s)): {"count": int(len(g)), "time_ns": ns(g["dur"].sum())}
            for s, g in gpu.groupby("stream")
        }
        mem = gpu[gpu["ktype"] == "MEMORY"]
        memory = {
            k: {"count": int(len(g)), "time_ns": ns(g["dur"].sum())}
            for k, g in mem.groupby(mem["kname"].map(get_memory_kernel_type))
        }
        typed = df[df["stream"].ne(-1)].copy()  # the population of HTA's kernel breakdown
        typed["ktype"] = typed["name"].map(lambda i: get_kernel_type(sym[i]))
        unions = {}
        for ktype, g in typed.groupby("ktype"):
            merged = merge_kernel_intervals(g.copy())
            unions[str(ktype)] = ns(merged["end"].sum() - merged["ts"].sum())
        ranks[str(int(rank))] = {
            "streams": streams,
            "memory": memory,
            "type_union_ns": unions,
            "window": {"kernels": int(len(gpu)), "first_ns": ns(gpu["ts"].min() + t.min_ts)},
        }
    temporal = analysis.get_temporal_breakdown(visualize=False)
    for _, row in temporal.iterrows():
        ranks[str(int(row["rank"]))]["temporal"] = {
            "idle_ns": ns(row["idle_time(us)"]),
            "compute_ns": ns(row["compute_time(us)"]),
            "non_compute_ns": ns(row["non_compute_time(us)"]),
            "kernel_time_ns": ns(row["kernel_time(us)"]),
        }
    types, kernels = analysis.get_gpu_kernel_breakdown(
        visualize=False, duration_ratio=1.0, num_kernels=TOP_N, include_memory_kernels=True
    )
    for r in ranks.values():  # one rank per trace here: HTA's type table is over all ranks
        pairs = zip(types["kernel_type"], types["sum"], strict=True)
        r["kernel_types"] = {str(k): ns(v) for k, v in pairs}
    for _, row in kernels.iterrows():
        top = ranks[str(int(row["rank"]))].setdefault("top_kernels", {})
        top.setdefault(row["kernel_type"], []).append(
            {"name": row["name"], "sum_ns": ns(row["sum (us)"]), "max_ns": ns(row["max (us)"]),
             "min_ns": ns(row["min (us)"]), "mean_ns": ns(row["mean (us)"])}
        )  # fmt: skip
    for r in ranks.values():
        for rows in r.get("top_kernels", {}).values():
            rows.sort(key=lambda k: (-k["sum_ns"], k["name"]))
    return {"file": trace.name, "ranks": ranks}


def main() -> None:
    try:
        import hta  # noqa: F401
    except ImportError:
        python = ensure_venv()
        os.execv(str(python), [str(python), __file__, *sys.argv[1:]])
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    from importlib.metadata import version

    results = {}
    for trace in sorted(TRACES.glob("*.json.gz")):
        got = analyse(trace)
        if got is not None:
            results[trace.name] = got
    OUT.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "hta_version": version("holistictraceanalysis"),
        "settings": {"HTA_DISABLE_NS_ROUNDING": "1", "include_last_profiler_step": False},
        "traces": results,
    }
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({len(results)} traces)")


if __name__ == "__main__":
    main()
