"""Smoke test of an installed neuron-explorer wheel, run by .ci/wheel-smoke in a fresh venv
outside the checkout: python wheel_smoke.py TRACE (a tests/data trace). Each check prints one
line; the first failure raises, so the exit status says whether the wheel works."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import warnings
from pathlib import Path

HERE = Path.cwd()
BIN = Path(sys.executable).parent


def check(what: str, ok: bool, detail: object = "") -> None:
    if not ok:
        raise SystemExit(f"wheel smoke: FAILED: {what} {detail}")
    print(f"wheel smoke: ok: {what}", flush=True)


def device() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import torch

        import neuron_explorer
        from neuron_explorer.backend.runtime import guard
    here = Path(neuron_explorer.__file__).resolve()
    check("the package comes from the venv", "site-packages" in str(here), here)
    check("no checkout on sys.path", not any(Path(p, "pyproject.toml").exists() for p in sys.path))
    python_guard = [str(w.message) for w in seen if "Python device guard" in str(w.message)]
    check("the C++ guard (no Python device guard warning)", not python_guard, python_guard)
    check("guard kind is native", guard.kind == "native", guard.kind)
    x = torch.ones(4, 4, device="neuron")
    check("a device op", float((x @ x).sum().cpu()) == 64.0)
    torch.accelerator.synchronize()
    check("torch.accelerator.synchronize()", True)
    # the payload lives in host memory: pinned memory is plain host memory (guard.cpp's hooks)
    pinned = torch.arange(8.0).pin_memory()
    check("pin_memory()", pinned.device.type == "cpu" and pinned.tolist() == list(range(8)))
    gen = torch.Generator(device="neuron").manual_seed(0)
    check('torch.Generator(device="neuron")', torch.rand(3, generator=gen).shape == (3,))
    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    batches = list(torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True))
    check(
        "DataLoader(pin_memory=True)",
        [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]],
    )


TRAIN = """
import torch

model = torch.nn.Linear(16, 8).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(6):
    loss = model(torch.randn(32, 16, device="neuron")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "neuron-explorer"), *args], cwd=HERE, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    check(f"neuron-explorer {args[0]} exits 0", proc.returncode == 0, proc.stderr[-2000:])
    return proc


def capture_and_import(trace: Path) -> None:
    (HERE / "train.py").write_text(textwrap.dedent(TRAIN))
    proc = cli("capture", "-o", "profiles/run", "--", "python", "train.py")
    wrote = (HERE / "profiles" / "run" / "manifest.json").is_file()
    check("capture wrote profiles/run", wrote, proc.stderr[-3000:])
    kernels = cli("query", "profiles/run", "SELECT count(*) AS n FROM events WHERE kind = 'kernel'",
                  "--csv").stdout.split()  # fmt: skip
    check("the capture holds device kernels", int(kernels[-1]) > 0, kernels)
    cli("import", str(trace), "-o", "profiles/gpu")
    ops = cli("query", "profiles/gpu", "SELECT count(*) AS n FROM events", "--csv").stdout.split()
    check("the imported trace holds events", int(ops[-1]) > 0, ops)


def serve() -> None:
    proc = subprocess.Popen([str(BIN / "neuron-explorer"), "serve", "profiles", "--port", "0"],
                            cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        check("serve prints its 127.0.0.1 URL", url is not None, line)
        base = url.group(0) if url else ""
        for path, needle in [
            ("static/plotly.min.js", "plotly"),
            ("static/app.css", "{"),
            ("", "<html"),
            ("api/profiles", '"gpu"'),
            ("p/run", "<html"),
            ("p/run/timeline", "<html"),
        ]:
            with urllib.request.urlopen(base + path, timeout=60) as r:
                body = r.read().decode("utf-8", "replace")
            check(f"GET /{path}", r.status == 200 and needle in body, r.status)
        scripts = re.findall(r'src="/(static/[^"]+\.js)"', body)
        for path in scripts:
            with urllib.request.urlopen(base + path, timeout=60) as r:
                check(f"GET /{path}", r.status == 200 and len(r.read()) > 0, r.status)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    trace = Path(sys.argv[1]).resolve()
    started = time.perf_counter()
    device()
    capture_and_import(trace)
    serve()
    print(f"wheel smoke: all passed in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    work = Path(tempfile.mkdtemp(prefix="neuron-explorer-smoke-"))
    os.chdir(work)
    HERE = work
    try:
        main()
    finally:
        shutil.rmtree(work, ignore_errors=True)
