"""Capture each sample on the neuron device and check the linking (issue 4): flows from every
kernel to its framework op, the exact user line, compiles, fallbacks, syncs and one clock."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
backend = pytest.importorskip("neuron_explorer.backend")

from neuron_explorer.capture.runner import Schedule, run_captured  # noqa: E402
from neuron_explorer.model import Profile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
OWN_DIRS = (str(ROOT / "neuron_explorer") + "/",)
# torch.profiler writes a file under a sys.path entry relative to it: "neuron_explorer/backend/x.py"
OWN_PREFIXES = (*OWN_DIRS, "neuron_explorer/")
SMALL = Schedule(wait=1, warmup=1, active=2)

# Kernels of these ops must sit on a line whose text contains one of the snippets.
LINE_TEXT = {
    "aten::_softmax": ("softmax",),
    "aten::masked_fill": ("masked_fill",),
    "aten::gelu": ("gelu",),
    "aten::embedding": ("self.tok(", "self.pos("),
    "aten::native_layer_norm": ("ln", "self.ln"),
    "aten::bmm": ("@",),
    "aten::addcdiv_": ("optimizer.step()",),
    "aten::lerp_": ("optimizer.step()",),
    "aten::_foreach_addcdiv_": ("optimizer.step()",),
    "aten::_foreach_lerp_": ("optimizer.step()",),
    "aten::convolution": ("self.features(",),
    "aten::median": ("median",),
}


def _capture(tmp_path_factory, name: str, *args: str, schedule: Schedule = SMALL) -> Profile:
    out = tmp_path_factory.mktemp(name) / "profile"
    result = run_captured(["python", str(SAMPLES / f"{name}.py"), *args], out, schedule)
    assert result.exit_code == 0
    return Profile.open(out)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    return _capture(tmp_path_factory, "gpt_train", "--steps", "5")


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    from neuron_explorer.backend import clear_op_tracking, get_fallback_ops

    clear_op_tracking()
    profile = _capture(tmp_path_factory, "fallback_float64", "--steps", "5")
    return profile, set(get_fallback_ops())


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return _capture(tmp_path_factory, "cnn_dataloader", "--steps", "5")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    from neuron_explorer.backend import compile_stats, reset_compile_stats

    reset_compile_stats()
    profile = _capture(
        tmp_path_factory, "gpt_compile", "--steps", "5", "--switch-at", "3", "--layers", "1",
        schedule=Schedule(wait=1, warmup=1, active=3),
    )  # fmt: skip
    return profile, compile_stats()


def _rows(profile: Profile, sql: str) -> list[dict]:
    cur = profile.duckdb().execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


@pytest.fixture(params=["gpt", "fallback", "cnn", "compiled"])
def sample(request):
    value = request.getfixturevalue(request.param)
    return value[0] if isinstance(value, tuple) else value


def test_every_kernel_has_a_flow_to_the_framework_op_that_launched_it(sample):
    kernels = _rows(
        sample,
        """SELECT k.id, k.op_name, l.kind AS launch_kind, o.kind AS op_kind, o.name AS op
           FROM events k
           LEFT JOIN events l ON l.flow_id = k.flow_id AND l.layer = 'host'
           LEFT JOIN events o ON o.id = l.parent_id
           WHERE k.kind = 'kernel'""",
    )
    assert len(kernels) > 20
    for k in kernels:
        assert k["launch_kind"] == "runtime", k
        assert k["op_kind"] == "op", k
        if not k["op_name"].startswith("neuron_graph_"):  # graph programs: CompiledFunction
            assert k["op"] == k["op_name"], k


def test_kernels_carry_the_user_line_that_launched_them(sample):
    kernels = _rows(
        sample,
        "SELECT op_name, src_file, src_line, args FROM events WHERE kind = 'kernel'",
    )
    with_line = [k for k in kernels if k["src_line"] is not None]
    # backward kernels of a view (split -> cat, transpose -> clone) take the view's line too,
    # from the runtime's "forward" marker for the autograd node (no forward kernel to inherit)
    assert len(with_line) >= 0.95 * len(kernels)
    checked = 0
    for k in with_line:
        path = Path(k["src_file"])
        assert path.is_relative_to(SAMPLES), k  # a sample's line, never the backend's
        text = path.read_text().splitlines()[k["src_line"] - 1]
        assert text.strip() and not text.strip().startswith("#"), k
        assert sample.source_text(k["src_file"]) == path.read_text()  # kept in sources/
        wanted = LINE_TEXT.get(k["op_name"])
        if wanted and "backward" not in (k["args"] or ""):
            assert any(w in text for w in wanted), (k, text)
            checked += 1
    assert checked >= 3


def test_backward_kernels_take_the_line_of_their_forward_op(gpt):
    rows = _rows(
        gpt,
        """SELECT src_file, src_line, op_name FROM events
           WHERE kind = 'kernel' AND args LIKE '%"backward": true%'""",
    )
    assert len(rows) > 20
    lines = [r for r in rows if r["src_line"] is not None]
    # Backward of a view (no forward kernel, so no recorded line) is the usual exception.
    assert len(lines) >= 0.8 * len(rows)
    assert {Path(r["src_file"]).name for r in lines} == {"models.py"}


def test_a_capture_writes_only_declared_kinds(sample):
    from neuron_explorer.vocab.kinds import EVENT_KINDS

    sql = "SELECT DISTINCT CAST(kind AS VARCHAR) AS k FROM events"
    found = {r["k"] for r in _rows(sample, sql)}
    assert {"op", "kernel", "runtime"} <= found <= set(EVENT_KINDS)


def test_the_projects_own_frames_are_never_user_frames(sample):
    files = [r["f"] for r in _rows(sample, "SELECT DISTINCT src_file AS f FROM events")]
    files += [r["f"] for r in _rows(sample, "SELECT DISTINCT file AS f FROM stacks")]
    assert not [f for f in files if f and f.startswith(OWN_PREFIXES)]
    names = _rows(sample, "SELECT name FROM events WHERE kind = 'python'")
    assert not [
        n
        for n in names
        if n["name"].startswith(OWN_PREFIXES) or any(d in n["name"] for d in OWN_DIRS)
    ]


def test_device_work_sits_on_its_tracks_after_its_launch(gpt):
    tracks = {
        r["track"] for r in _rows(gpt, "SELECT DISTINCT track FROM events WHERE layer = 'device'")
    }
    assert "kernels" in tracks and "TensorE" in tracks and "VectorE" in tracks
    assert any(re.fullmatch(r"DMA q\d+", t) for t in tracks)
    late = _rows(
        gpt,
        """SELECT k.id FROM events k JOIN events l ON l.flow_id = k.flow_id AND l.layer = 'host'
           WHERE k.kind = 'kernel' AND k.start_ns < l.start_ns""",
    )
    assert not late  # on one clock a kernel never starts before it is launched


def test_launch_bound_eager_step_has_device_idle_gaps(gpt):
    steps = gpt.manifest.steps
    assert [s.step for s in steps] == [2, 3]
    for s in steps:
        kernels = _rows(
            gpt,
            f"""SELECT start_ns, dur_ns FROM events WHERE kind = 'kernel' AND step = {s.step}
                ORDER BY start_ns""",
        )
        busy, end, gaps = 0, None, 0
        for k in kernels:
            if end is not None and k["start_ns"] > end:
                gaps += 1
            begin = k["start_ns"] if end is None else max(k["start_ns"], end)
            end = max(end or 0, k["start_ns"] + k["dur_ns"])
            busy += max(0, end - begin)
        assert gaps >= len(kernels) // 2
        assert busy < 0.5 * s.dur_ns  # the device idles most of an eager, launch-bound step


def test_fallback_ops_equal_get_fallback_ops(fallback):
    profile, expected = fallback
    found = {
        r["op_name"] for r in _rows(profile, "SELECT op_name FROM events WHERE kind = 'fallback'")
    }
    assert expected and found == expected
    dtypes = [
        r["dtypes"] for r in _rows(profile, "SELECT dtypes FROM events WHERE dtypes IS NOT NULL")
    ]
    assert any("float64" in d for d in dtypes)


def test_memory_counters_and_device_spec(gpt):
    assert gpt.manifest.source == "capture"
    assert gpt.manifest.device_spec and gpt.manifest.device_spec.get("name")
    mem = _rows(gpt, "SELECT value FROM counters WHERE name = 'memory_allocated'")
    assert mem and all(r["value"] > 0 for r in mem)


def test_a_step_ending_in_item_waits_for_the_devices_remaining_work(tmp_path):
    import neuron_explorer

    x = torch.randn(1536, 1536, device="neuron")
    out = tmp_path / "sync"
    with neuron_explorer.profile(out, wait=0, warmup=1, active=2) as prof:
        for _ in range(3):
            y = x
            for _ in range(3):
                y = y @ x  # device-bound: each matmul is long on the device, quick to launch
            y.sum().item()
            prof.step()
    profile = Profile.open(out)
    syncs = _rows(profile, "SELECT start_ns, dur_ns, args FROM events WHERE name = '.item()'")
    assert len(syncs) == 2
    for s in syncs:
        busy_until = _rows(
            profile,
            f"""SELECT max(k.start_ns + k.dur_ns) AS t FROM events k
                JOIN events l ON l.flow_id = k.flow_id AND l.layer = 'host'
                WHERE k.kind = 'kernel' AND l.start_ns < {s["start_ns"]}""",
        )[0]["t"]
        remaining = busy_until - s["start_ns"]
        assert remaining > 100_000  # the device still had work when .item() was called
        assert json.loads(s["args"])["wait_ns"] == remaining
        assert remaining <= s["dur_ns"] <= remaining + 100_000


def test_placing_a_long_queue_at_a_sync_is_cut_from_the_host(tmp_path):
    import neuron_explorer

    # kernels of ~25 us each on the device: far behind any host, however slow, at the sync
    x = torch.randn(1024, 1024, device="neuron")
    out = tmp_path / "queue"
    with neuron_explorer.profile(out, wait=0, warmup=1, active=1) as prof:
        for _ in range(2):
            y = x
            for _ in range(400):
                y = y * 1.0001  # 400 kernels queued, placed on the device timeline at the sync
            y.sum().item()
            prof.step()
    profile = Profile.open(out)
    (sync,) = _rows(profile, "SELECT start_ns, dur_ns, args FROM events WHERE name = '.item()'")
    (op,) = _rows(
        profile, "SELECT dur_ns FROM events WHERE name = 'aten::_local_scalar_dense' AND step = 1"
    )
    (last,) = _rows(
        profile,
        "SELECT max(start_ns + dur_ns) AS end_ns FROM events"
        " WHERE layer = 'device' AND kind = 'kernel' AND step = 1",
    )
    # the simulator's scheduling took real time inside the sync's span; the sync shows only
    # its modeled cost: the wait for the last kernel, then the runtime's round trip
    args = json.loads(sync["args"])
    assert args["real_ns"] > 0
    sync_ns = profile.manifest.device_spec["runtime"]["sync_ns"]
    assert sync["start_ns"] + sync["dur_ns"] == last["end_ns"] + sync_ns
    assert sync["dur_ns"] == args["wait_ns"] + sync_ns
    assert op["dur_ns"] - sync["dur_ns"] < 500_000


def test_garbage_collector_pauses_outside_the_backend_are_cut_from_the_host(tmp_path):
    import gc
    import time

    import neuron_explorer

    x = torch.randn(64, 64, device="neuron")
    pauses: list[int] = []
    start = [0]

    def timer(phase, _info):
        if phase == "start":
            start[0] = time.perf_counter_ns()
        else:
            pauses.append(time.perf_counter_ns() - start[0])

    out = tmp_path / "gc"
    with neuron_explorer.profile(out, wait=0, warmup=1, active=1) as prof:
        for step in range(2):
            y = x
            for _ in range(200):
                y = y * 1.0001
            if step == 1:
                gc.callbacks.append(timer)
                gc.collect()  # a full collection between two ops, outside any backend call
                gc.callbacks.remove(timer)
            y.sum()
            prof.step()
    (pause,) = pauses
    profile = Profile.open(out)
    mul, total = _rows(
        profile,
        """SELECT max(start_ns + dur_ns) AS mul_end,
               (SELECT start_ns FROM events WHERE name = 'aten::sum' AND step = 1) AS sum_start
           FROM events WHERE name = 'aten::mul' AND step = 1""",
    )[0].values()
    # the pause (milliseconds with the simulator's objects) is gone from between the two ops
    assert pause > 1_000_000
    assert total - mul < pause / 2
    assert "gc" not in {r["kind"] for r in _rows(profile, "SELECT DISTINCT kind FROM events")}


def test_compiles_and_recompiles_equal_what_the_sample_does(compiled):
    profile, stats = compiled
    # The sample compiles its graphs in step 0 (before the window) and changes the sequence
    # length once, in step 3: each graph compiles again there, and steps 2 and 4 compile none.
    graphs = _rows(
        profile, "SELECT step, args FROM events WHERE kind = 'compile' AND name = 'graph compile'"
    )
    forward = [g for g in graphs if json.loads(g["args"])["graph"] == "forward"]
    assert stats.graph_compiles >= 2
    assert len(forward) == stats.graph_compiles // 2
    assert {g["step"] for g in graphs} == {3}
    recompiles = _rows(
        profile, "SELECT step FROM events WHERE kind = 'compile' AND name = 'recompile'"
    )
    assert [r["step"] for r in recompiles] == [3] * stats.graph_recompiles


def test_compiled_kernels_carry_their_fx_nodes_lines(compiled):
    profile, _ = compiled
    kernels = _rows(
        profile,
        """SELECT src_file, src_line FROM events
           WHERE kind = 'kernel' AND op_name LIKE 'neuron_graph_%'""",
    )
    assert len(kernels) > 10
    lines = {(k["src_file"], k["src_line"]) for k in kernels if k["src_line"] is not None}
    assert len(lines) > 5  # many FX nodes' lines, not one line for the whole program
    assert {Path(f).name for f, _ in lines} <= {"models.py", "gpt_compile.py"}


def test_with_stack_the_backends_frames_and_what_they_call_are_left_out(tmp_path):
    import neuron_explorer

    model = torch.nn.Linear(8, 4).to("neuron")
    out = tmp_path / "stack"
    with neuron_explorer.profile(out, with_stack=True):
        for _ in range(2):
            model(torch.randn(4, 8, device="neuron")).sum().backward()
    profile = Profile.open(out)
    frames = _rows(profile, "SELECT DISTINCT file FROM stacks")
    assert frames and not [f for f in frames if f["file"].startswith(OWN_PREFIXES)]
    python = _rows(profile, "SELECT name FROM events WHERE kind = 'python'")
    assert python and not [
        p for p in python if "time_ns" in p["name"] or "neuron_explorer/" in p["name"]
    ]
    lines = _rows(profile, "SELECT DISTINCT src_file FROM events WHERE src_file IS NOT NULL")
    assert [Path(r["src_file"]).name for r in lines] == [Path(__file__).name] * len(lines)


def test_a_script_captured_whole_moves_its_model_and_keeps_op_shapes(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(8, 4).to('neuron')  # inside the recording: no shapes yet\n"
        "for _ in range(2):\n"
        "    model(torch.randn(16, 8, device='neuron')).sum().item()\n"
    )
    out = tmp_path / "run"
    assert run_captured(["python", str(script)], out).exit_code == 0
    profile = Profile.open(out)
    assert [s.step for s in profile.manifest.steps] == [0]
    ops = _rows(profile, "SELECT shapes, src_line FROM events WHERE name = 'aten::addmm'")
    assert [(json.loads(o["shapes"]), o["src_line"]) for o in ops] == [
        ([[4], [16, 8], [8, 4]], 4)
    ] * 2


@pytest.mark.parametrize(
    "name, fixture",
    [("gpt_train", "gpt"), ("gpt_compile", "compiled"), ("cnn_dataloader", "cnn"),
     ("fallback_float64", "fallback")],
)  # fmt: skip
def test_a_fresh_capture_shows_the_samples_known_problems_on_top(request, name, fixture):
    from test_analysis_rules import known_on_top

    from neuron_explorer.analysis import run_rules

    value = request.getfixturevalue(fixture)
    known_on_top(name, run_rules(value[0] if isinstance(value, tuple) else value))


def test_the_recompile_finding_counts_what_the_sample_recompiled(compiled):
    from neuron_explorer.analysis import get_rule

    profile, stats = compiled
    (f,) = get_rule("recompilation").evaluate(profile)
    m = f.evidence.metrics
    # one shape change: dynamo compiles the model once more (graph_compiles counts the first
    # compile too), as a forward and a backward program; the eager loss ops outside the
    # graph compile again for the new shape
    assert m["graph_recompiles"] == stats.graph_compiles - 1 == 1
    assert m["graph_compile_pieces"] == 2
    assert m["op_recompiles"] >= 1
    assert m["recompiles"] == m["graph_recompiles"] + m["op_recompiles"]
    assert f"{m['graph_recompiles']} graph(s)" in f.title
    assert f"{m['op_recompiles']} eager op(s)" in f.title
