"""HTA's critical path of the AlexNet trace HTA's own critical-path test uses, written to
tests/data/hta-reference/critical_path.json: tests/test_critical_path.py checks that ours puts
the same kernels on the path.

    python benchmarks/hta_critical_path.py

Runs in the venv of benchmarks/hta_reference.py (HolisticTraceAnalysis 0.5.0) with HTA's test
settings: the second instance (instance_id=1) of the annotation
"[param|pytorch.model.alex_net|0|0|0|measure|forward]", CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE=1,
nanosecond rounding off. Recorded: the path's total and its time by HTA's `bound_by`, and each
kernel on the path (HTA edge type critical_path_operator on a stream) by its CUDA correlation id,
name and duration, in integer ns (HTA's float microseconds times 1000, rounded).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = (ROOT / "tests" / "data" / "kineto-gpu"
         / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz")  # fmt: skip
OUT = ROOT / "tests" / "data" / "hta-reference" / "critical_path.json"
ANNOTATION = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
INSTANCE = 1


def in_hta() -> dict:
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(TRACE, d)
        analyzer = TraceAnalysis(trace_dir=d)
        graph, ok = analyzer.critical_path_analysis(rank=0, annotation=ANNOTATION,
                                                    instance_id=INSTANCE)  # fmt: skip
        assert ok
        df = graph.get_critical_path_breakdown()
        trace = analyzer.t.get_trace(0)
        names = analyzer.t.symbol_table.get_sym_table()
    kernels = df[(df.stream >= 0) & (df.type == "critical_path_operator")]
    rows = trace.loc[kernels["index"].astype(int)]
    by = df.groupby("bound_by")["duration"].sum()
    import hta

    return {
        "hta_version": getattr(hta, "__version__", "0.5.0"),
        "trace": TRACE.name, "annotation": ANNOTATION, "instance": INSTANCE,
        "settings": {"HTA_DISABLE_NS_ROUNDING": "1", "CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE": "1"},
        "path_ns": int(round(float(df["duration"].sum()) * 1000)),
        "by_bound_ns": {str(k): int(round(float(v) * 1000)) for k, v in by.items() if k},
        "kernels": sorted(({"correlation": int(r["correlation"]), "name": names[int(r["name"])],
                            "dur_ns": int(round(float(r["dur"]) * 1000))}
                           for _, r in rows.iterrows()), key=lambda k: k["correlation"]),
    }  # fmt: skip


def main() -> None:
    if os.environ.get("HTA_CRITICAL_PATH_CHILD"):
        print(json.dumps(in_hta()))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hta_reference import ensure_venv

    env = {**os.environ, "HTA_CRITICAL_PATH_CHILD": "1", "HTA_DISABLE_NS_ROUNDING": "1",
           "CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # fmt: skip
    out = subprocess.run([str(ensure_venv()), __file__], env=env, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    doc = json.loads(out.strip().splitlines()[-1])
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}: {len(doc['kernels'])} kernels, path {doc['path_ns']} ns")


if __name__ == "__main__":
    main()
