"""Shared fixtures: the real traces in tests/data and profiles imported from them once."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
KINETO_GPU = DATA / "kineto-gpu"
SAMPLE_TRACE = ROOT / "samples" / "traces" / "cpu_mlp_train.pt.trace.json.gz"

# short name -> file in tests/data/kineto-gpu (see its README.md)
SHARED_KINETO = {
    "mi250": "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "cpu_only": "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "alexnet": "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
    "nccl": "nccl_parser_config_nccl_data.json.gz",
    "ns_resolution": "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "compare_base": "trace_compare_base_base.json.gz",
    "compare_test": "trace_compare_test_test.json.gz",
}


_SESSION_TMP: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """One temporary directory for the whole run, removed at its end: every tempfile this
    process or its children (captures, torchrun, chromium) make goes under it, so a run leaves
    nothing in the system's temporary directory. Set before collection: some test modules make
    their temporary profiles at import."""
    base = tempfile.mkdtemp(prefix="neuron-explorer-tests-")
    _SESSION_TMP.append(base)
    os.environ["TMPDIR"] = base
    tempfile.tempdir = base


def pytest_unconfigure(config: pytest.Config) -> None:
    for base in _SESSION_TMP:
        shutil.rmtree(base, ignore_errors=True)


def kineto_trace_paths() -> dict[str, Path]:
    """Every Kineto trace the suite imports: the shared GPU/CPU traces and the shipped sample."""
    paths = {name: KINETO_GPU / file for name, file in SHARED_KINETO.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    assert not missing, f"test data missing from the checkout: {missing}"
    paths["cpu_mlp"] = SAMPLE_TRACE
    return paths


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The directory tests/data, which holds the real traces (kineto-gpu/) the suite reads."""
    return DATA


@pytest.fixture(scope="session")
def imported_profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Profiles imported once per session: name -> profile directory.

    Names: mi250, cpu_only, alexnet, nccl, ns_resolution, compare_base, compare_test (the HTA
    traces in tests/data/kineto-gpu) and cpu_mlp (samples/traces).
    """
    from neuron_explorer.importers import import_traces

    out = tmp_path_factory.mktemp("imported")
    return {
        name: import_traces([path], out / name, source_roots=[ROOT / "samples"])
        for name, path in kineto_trace_paths().items()
    }


# The sample captures the page-model and diff tests serve: one rank (eager and compiled) and
# two ranks of one job.
SERVED_SAMPLES = ("gpt_train", "gpt_compile", "ddp_straggler")


@pytest.fixture(scope="session")
def served_samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of copies of SERVED_SAMPLES (samples/profiles), as `serve` would be given."""
    root = tmp_path_factory.mktemp("served-samples")
    for name in SERVED_SAMPLES:
        shutil.copytree(ROOT / "samples" / "profiles" / name, root / name)
    return root


@pytest.fixture(scope="session")
def sample_json(served_samples: Path, tmp_path_factory: pytest.TempPathFactory):
    """GET a URL of a web app serving `served_samples` (an analysis cache of its own): the JSON
    of a 200 answer, failing the test on any other."""
    from fastapi.testclient import TestClient

    from neuron_explorer.web.app import create_app

    client = TestClient(create_app(served_samples, analysis_cache=tmp_path_factory.mktemp("c")))

    def get(url: str) -> dict:
        r = client.get(url)
        assert r.status_code == 200, (url, r.text[:300])
        return r.json()

    return get


def without_file_ids(doc: object) -> object:
    """`doc` without the web's one decoration (a file id beside each source path), to compare
    a web document with the CLI's or the page model's."""
    if isinstance(doc, dict):
        return {k: without_file_ids(v) for k, v in doc.items() if k != "file_id"}
    if isinstance(doc, list):
        return [without_file_ids(v) for v in doc]
    return doc


@contextmanager
def uvicorn_server(app: object) -> Iterator[str]:
    """A real uvicorn serving `app` on 127.0.0.1 at a free port, in a thread: its base URL;
    stopped when the block ends."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
