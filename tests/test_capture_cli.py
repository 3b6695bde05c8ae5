"""`neuron-explorer capture` and `neuron_explorer.trace_handler` on plain CPU scripts: the script runs
as `python script.py` would, its status and output pass through, and steps are detected."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_explorer.capture.runner import Schedule, run_captured
from neuron_explorer.model import Profile

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "neuron_explorer"]
CPU_ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}

TRAIN = """
import sys
import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _script(tmp_path: Path, body: str, name: str = "script.py") -> Path:
    path = tmp_path / "code" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


def _steps(out: Path) -> list[int]:
    return [s.step for s in Profile.open(out).manifest.steps]


@pytest.mark.slow  # a captured subprocess: ~12 s
def test_exit_status_output_argv_and_path_pass_through(tmp_path):
    _script(tmp_path, "VALUE = 41\n", name="helper.py")
    script = _script(
        tmp_path,
        """
        import os, sys
        import helper  # found because the script's directory is on sys.path
        print("name", __name__, "argv", sys.argv[1:], "value", helper.VALUE + 1)
        print("to stderr", file=sys.stderr)
        sys.exit(3)
        """,
    )
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    out = tmp_path / "profiles" / "run"
    proc = subprocess.run(
        [*CLI, "capture", "-o", str(out), "--", "python", str(script), "a", "--b"],
        cwd=elsewhere, env={**CPU_ENV, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "name __main__ argv ['a', '--b'] value 42" in proc.stdout
    assert "to stderr" in proc.stderr
    assert _steps(out) == [0]  # no step markers: the whole run is one step


@pytest.mark.slow  # a captured subprocess: ~13 s on a busy machine
def test_a_script_that_raises_still_leaves_its_profile(tmp_path):
    script = _script(
        tmp_path,
        TRAIN + "\nraise ValueError('broken on purpose')\n",
    )
    out = tmp_path / "run"
    proc = subprocess.run(
        [*CLI, "capture", "-o", str(out), "--active", "2", "--", "python", str(script), "6"],
        cwd=tmp_path, env={**CPU_ENV, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "ValueError: broken on purpose" in proc.stderr
    assert 'script.py", line' in proc.stderr and "runpy" not in proc.stderr
    assert _steps(out) == [2, 3]


def test_a_torchrun_rank_keeps_what_its_script_left_until_it_exits(tmp_path, monkeypatch):
    """A torchrun rank keeps the script's globals (its DDP model, whose gloo group's teardown
    with the GIL held hung both ranks one capture in five when runpy's copy was dropped), as
    `python script.py` keeps them until exit; another process frees them after the capture."""
    import torch

    from neuron_explorer.capture import runner

    script, once = _script(tmp_path, TRAIN), Schedule(1, 1, 1)
    before = len(runner._SCRIPT_STATE)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert run_captured(["python", str(script), "4"], tmp_path / "a", once).exit_code == 0
    assert len(runner._SCRIPT_STATE) == before
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's static rendezvous sets it so
    assert run_captured(["python", str(script), "4"], tmp_path / "b", once).exit_code == 0
    kept = runner._SCRIPT_STATE.pop()
    assert len(runner._SCRIPT_STATE) == before and isinstance(kept["model"], torch.nn.Linear)


def test_steps_come_from_optimizer_step(tmp_path):
    script = _script(tmp_path, TRAIN)
    out = tmp_path / "run"
    result = run_captured(["python", str(script), "8"], out, Schedule(1, 1, 3))
    assert result.exit_code == 0 and result.step_source == "optimizer"
    assert _steps(out) == [2, 3, 4]
    recorded = Profile.open(out).manifest.extra["capture"]
    assert recorded == {"command": ["python", str(script), "8"],
                        "schedule": {"wait": 1, "warmup": 1, "active": 3, "repeat": 1}}  # fmt: skip
    ops = (
        Profile.open(out)
        .duckdb()
        .execute("SELECT count(*) FROM events WHERE name = 'aten::addmm' AND shapes IS NOT NULL")
    )
    assert ops.fetchone()[0] == 3  # one forward linear per recorded step, with shapes


def test_optimizer_step_spans_end_with_the_update_not_the_recording(tmp_path):
    # capture's step marker is an optimizer post-hook, run inside torch.optim's
    # Optimizer.step span: after the last active step the profiler stopped inside it, and Kineto
    # left it open to the end of the recording (4x the update on a Transformers GPT-2)
    script = _script(tmp_path, TRAIN)
    out = tmp_path / "run"
    run_captured(["python", str(script), "8"], out, Schedule(1, 1, 3))
    con = Profile.open(out).duckdb()
    spans = con.execute(
        """SELECT o.step, o.start_ns + o.dur_ns AS e, s.start_ns + s.dur_ns AS step_e,
                  (SELECT max(c.start_ns + c.dur_ns) FROM events c WHERE c.parent_id = o.id) AS c
        FROM events o JOIN events s ON s.kind = 'step' AND s.step = o.step
        WHERE o.name LIKE 'Optimizer.step#%' ORDER BY o.step"""
    ).fetchall()
    assert [r[0] for r in spans] == [2, 3, 4]
    for _, end, step_end, last_child in spans:
        assert end == last_child and end <= step_end  # the update, inside its step
    marker = "SELECT count(*) FROM events WHERE name = 'Record Window End'"
    assert con.execute(marker).fetchone()[0] == 0  # the profiler's own stop is not work


def test_an_optimizer_step_that_records_no_op_ends_with_its_step(tmp_path):
    # no gradients (no backward): step() runs no op, so the span has no child to end with
    script = _script(tmp_path, TRAIN.replace("    loss.backward()\n", ""))
    out = tmp_path / "run"
    run_captured(["python", str(script), "8"], out, Schedule(1, 1, 3))
    con = Profile.open(out).duckdb()
    spans = con.execute(
        """SELECT o.step, o.start_ns + o.dur_ns <= s.start_ns + s.dur_ns,
                  (SELECT count(*) FROM events c WHERE c.parent_id = o.id)
        FROM events o JOIN events s ON s.kind = 'step' AND s.step = o.step
        WHERE o.name LIKE 'Optimizer.step#%' ORDER BY o.step"""
    ).fetchall()
    assert spans == [(2, True, 0), (3, True, 0), (4, True, 0)]


OWN_PROFILER = """
with torch.profiler.profile(
    schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
    on_trace_ready=lambda p: (p.export_chrome_trace("mine.json"), print("mine at", p.step_num)),
) as prof:
    for _ in range(6):
        with torch.profiler.record_function("forward"):
            loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.step()  # two optimizer steps per iteration: only prof.step() marks a step
        prof.step()
averages = prof.key_averages()
print(averages.table(sort_by="cpu_time_total", row_limit=4))
print("forward count", sum(e.count for e in averages if e.key == "forward"))
"""


@pytest.mark.slow  # a captured subprocess: ~9 s
def test_the_scripts_own_profiler_keeps_working_and_its_cycle_is_our_profile(tmp_path):
    script = _script(tmp_path, TRAIN + OWN_PROFILER)
    out = tmp_path / "run"
    proc = subprocess.run(
        [*CLI, "capture", "-o", str(out), "--", "python", str(script), "3"],
        cwd=tmp_path, env={**CPU_ENV, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # The script's handler ran and wrote its own trace; its key_averages table printed, and
    # its averages hold its annotation once for each active step (a count: which rows a
    # row_limit=4 table by CPU time shows moves with the host's speed)
    assert "mine at 4" in proc.stdout
    assert "Self CPU time total" in proc.stdout and "forward count 2\n" in proc.stdout
    mine = json.loads((tmp_path / "mine.json").read_text())
    assert {e["name"] for e in mine["traceEvents"]} >= {"ProfilerStep#2", "ProfilerStep#3"}
    # Our profile is the cycle the script's schedule recorded (not capture's --wait/--active).
    assert _steps(out) == [2, 3]
    forwards = (
        Profile.open(out)
        .duckdb()
        .execute("SELECT count(*) FROM events WHERE kind = 'annotation' AND name = 'forward'")
    )
    assert forwards.fetchone()[0] == 2
    assert "USDT" not in proc.stderr and "profiler_start" not in proc.stderr


def test_the_scripts_profiler_exports_after_its_block_and_the_run_stays_whole(
    tmp_path, monkeypatch
):
    script = _script(
        tmp_path,
        TRAIN
        + """
with torch.profiler.profile() as prof:
    model(torch.randn(16, 8)).sum().backward()
prof.export_chrome_trace("after.json.gz")
""",
    )
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    result = run_captured(["python", str(script), "0"], out, Schedule(1, 1, 3))
    assert result.exit_code == 0 and result.step_source == "profiler"
    with gzip.open(tmp_path / "after.json.gz", "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"]}
    assert "aten::addmm" in names
    addmm = (
        Profile.open(out).duckdb().execute("SELECT count(*) FROM events WHERE name = 'aten::addmm'")
    )
    assert addmm.fetchone()[0] == 1  # the script's block, recorded once, in both


def test_a_script_with_tensorboard_trace_handler_runs_and_writes_its_traces(tmp_path, monkeypatch):
    # torch's handler calls export_chrome_trace(path, use_python_export=...): the script's own
    # traces are written beside ours and the run ends well (issue 28)
    script = _script(
        tmp_path,
        TRAIN
        + """
with torch.profiler.profile(
    schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
    on_trace_ready=torch.profiler.tensorboard_trace_handler("tb", worker_name="w0"),
) as prof:
    for _ in range(5):
        model(torch.randn(16, 8)).sum().backward()
        prof.step()
with torch.profiler.profile() as after:
    model(torch.randn(16, 8)).sum().backward()
after.export_chrome_trace("after.json", use_python_export=False)
""",
    )
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    result = run_captured(["python", str(script), "0"], out, Schedule(1, 1, 3))
    assert result.exit_code == 0
    (trace,) = (tmp_path / "tb").glob("w0.*.pt.trace.json")
    assert "ProfilerStep#3" in {e["name"] for e in json.loads(trace.read_text())["traceEvents"]}
    assert "aten::addmm" in {
        e["name"] for e in json.loads((tmp_path / "after.json").read_text())["traceEvents"]
    }
    assert _steps(out) == [2, 3]


DEVICE_SCRIPT = """
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = model.to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 16, device="neuron")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], with_stack=True,
             schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=tensorboard_trace_handler("tb")) as prof:
    for _ in range(4):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        prof.step()
"""


def test_a_device_script_profiling_with_stacks_keeps_its_steps_and_frames(tmp_path, monkeypatch):
    # with_stack=True: capture's runner (our frames) encloses the script's; it went with all it
    # held, the ProfilerStep spans and the script's frames too, so the profile had no steps
    # (issue 28). The script's tensorboard trace, imported, gives the same kernels.
    from neuron_explorer.cli import main

    script = _script(tmp_path, DEVICE_SCRIPT)
    monkeypatch.chdir(tmp_path)
    result = run_captured(["python", str(script)], tmp_path / "run", Schedule(1, 1, 3))
    assert result.exit_code == 0
    assert _steps(tmp_path / "run") == [2, 3]
    (trace,) = (tmp_path / "tb").glob("*.pt.trace.json")
    assert main(["import", str(trace), "-o", str(tmp_path / "imported"), "-q"]) == 0
    query = (
        "SELECT step, name, dur_ns, op_name, src_line, module FROM events WHERE kind = 'kernel' "
        "ORDER BY start_ns"
    )
    captured = Profile.open(tmp_path / "run").duckdb()
    kernels = captured.execute(query).fetchall()
    assert len(kernels) == 40 and {k[0] for k in kernels} == {2, 3}
    assert kernels == Profile.open(tmp_path / "imported").duckdb().execute(query).fetchall()
    frames = captured.execute(
        "SELECT count(*) FROM events WHERE kind = 'python' AND name LIKE 'script.py(%'"
    ).fetchone()[0]
    assert frames >= 1
    own = "SELECT count(*) FROM events WHERE kind = 'python' AND name LIKE '%neuron_explorer/%'"
    assert captured.execute(own).fetchone()[0] == 0


STACK_SCRIPT = """
import torch
from torch.profiler import profile, schedule
model = torch.nn.Linear(16, 4)
with profile(with_stack=True, schedule=schedule(wait=1, warmup=1, active=2)) as prof:
    for _ in range(4):
        model(torch.randn(8, 16)).sum().backward()
        prof.step()
"""


def test_a_scripts_frames_keep_their_names_after_an_earlier_recording_with_stacks(tmp_path):
    # torch.profiler computes the prefixes it trims from frames' files once, at the process's
    # first with_stack recording: a capture after it in the same process, whose runner put the
    # script's directory on sys.path since, got 'code/script.py(...)' frames, which no user
    # file matches (the test above failed after tests/test_capture_samples.py). Frames are
    # named by sys.path as it is at the capture (capture/host.py), as a fresh process would.
    import torch

    with torch.profiler.profile(with_stack=True):  # the process's prefixes: frozen by now
        torch.nn.Linear(8, 4)(torch.randn(4, 8)).sum().backward()
    script = _script(tmp_path, STACK_SCRIPT)
    assert run_captured(["python", str(script)], tmp_path / "run").exit_code == 0
    names = [r[0] for r in Profile.open(tmp_path / "run").duckdb().execute(
        "SELECT name FROM events WHERE kind = 'python' AND name LIKE '%script.py(%'"
    ).fetchall()]  # fmt: skip
    assert names and all(n.startswith("script.py(") for n in names), names[:3]


def test_a_run_shorter_than_the_schedule_keeps_its_first_step(tmp_path):
    script = _script(tmp_path, TRAIN)
    out = tmp_path / "run"
    result = run_captured(["python", str(script), "2"], out, Schedule(1, 1, 3))
    assert result.exit_code == 0
    assert _steps(out) == [0]


def test_trace_handler_writes_one_profile_per_active_cycle(tmp_path):
    import torch

    import neuron_explorer

    model = torch.nn.Linear(8, 4)
    handler = neuron_explorer.trace_handler(tmp_path / "run")
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with torch.profiler.profile(schedule=sched, on_trace_ready=handler) as prof:
        for _ in range(9):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    assert handler.written == [tmp_path / "run", tmp_path / "run.cycle2"]
    assert _steps(tmp_path / "run") == [2, 3]
    assert _steps(tmp_path / "run.cycle2") == [6, 7]
    assert Profile.open(tmp_path / "run").manifest.source == "capture"


def test_an_existing_directory_that_is_not_a_profile_is_never_replaced(tmp_path):
    import neuron_explorer
    from neuron_explorer.errors import ExplorerError

    keep = tmp_path / "data"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(ExplorerError, match="not a profile"):
        neuron_explorer.trace_handler(keep)
    assert (keep / "notes.txt").read_text() == "mine"


def test_a_missing_script_is_a_one_line_error(tmp_path):
    proc = subprocess.run(
        [*CLI, "capture", "-o", str(tmp_path / "x"), "--", "python", "nope.py"],
        cwd=tmp_path, env={**CPU_ENV, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == "neuron-explorer: error: nope.py: no such script"
    assert not (tmp_path / "x").exists()


def test_without_optimizer_or_profiler_a_repeated_record_function_marks_the_steps(tmp_path):
    script = _script(
        tmp_path,
        """
        import torch

        model = torch.nn.Linear(8, 4)
        for _ in range(4):
            with torch.profiler.record_function("train_step"):
                model(torch.randn(16, 8)).sum().backward()
        with torch.profiler.record_function("evaluate"):
            model(torch.randn(2, 8))
        """,
    )
    out = tmp_path / "run"
    result = run_captured(["python", str(script)], out, Schedule(1, 1, 3))
    assert result.exit_code == 0 and result.step_source == "none"
    profile = Profile.open(out)
    assert _steps(out) == [0, 1, 2, 3]
    per_step = profile.duckdb().execute(
        "SELECT step, count(*) FROM events WHERE name = 'aten::addmm' GROUP BY 1 ORDER BY 1"
    )
    assert per_step.fetchall() == [(0, 1), (1, 1), (2, 1), (3, 1), (None, 1)]


def test_two_optimizers_stepping_each_iteration_count_one_step(tmp_path):
    script = _script(
        tmp_path,
        """
        import torch

        gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        g_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
        d_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
        for _ in range(6):
            disc(gen(torch.randn(8, 4))).mean().backward()
            d_opt.step()
            g_opt.step()
        """,
    )
    out = tmp_path / "run"
    result = run_captured(["python", str(script)], out, Schedule(1, 1, 2))
    assert result.exit_code == 0 and result.steps_seen == 6
    assert _steps(out) == [2, 3]


def test_python_dash_m_runs_a_module_from_the_working_directory(tmp_path, monkeypatch, capsys):
    _script(tmp_path, TRAIN + "\nprint('module ran as', __name__)\n", name="trainmod.py")
    monkeypatch.chdir(tmp_path / "code")
    out = tmp_path / "run"
    result = run_captured(["python", "-m", "trainmod", "6"], out, Schedule(1, 1, 2))
    assert result.exit_code == 0
    assert "module ran as __main__" in capsys.readouterr().out
    assert _steps(out) == [2, 3]


def _venv(where: Path, with_us: bool) -> Path:
    """A second virtual environment; `with_us` makes this one's packages and the checkout
    importable in it (a .pth file), as an install of neuron-explorer there would."""
    import site
    import venv

    venv.create(where, with_pip=False)
    (pkgs,) = where.glob("lib/python3*/site-packages")
    if with_us:
        (pkgs / "ours.pth").write_text(f"{ROOT}\n" + "\n".join(site.getsitepackages()) + "\n")
    return where / "bin" / "python"


def test_an_interpreter_that_sees_the_package_without_its_dependencies_is_one_line(tmp_path):
    # a PYTHONPATH shows the package to a bare interpreter that has no torch: the probe asked
    # only for the package, and the rerun there died in a traceback (issue 28)
    bare = _venv(tmp_path / "bare", with_us=False)
    script = _script(tmp_path, TRAIN)
    env = {**CPU_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [*CLI, "capture", "-o", str(tmp_path / "run"), "--", str(bare), str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not with its dependencies" in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.sweep  # a second venv and a captured subprocess: ~10 s quiet (default suite < 15 min)
def test_an_interpreter_named_by_path_runs_the_script(tmp_path):
    # `capture -- /other/env/bin/python script.py` runs under that interpreter, as the same
    # command without capture would, not under neuron-explorer's own (issue 28)
    env = {k: v for k, v in CPU_ENV.items() if k != "PYTHONPATH"}  # the venvs' own paths only
    other = _venv(tmp_path / "env", with_us=True)
    script = _script(tmp_path, TRAIN + "print('prefix', sys.prefix)\n")
    out = tmp_path / "run"
    proc = subprocess.run(
        [*CLI, "capture", "-o", str(out), "--", str(other), str(script), "5"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"prefix {tmp_path / 'env'}" in proc.stdout
    assert _steps(out) == [2, 3, 4]
    bare = _venv(tmp_path / "bare", with_us=False)
    proc = subprocess.run(
        [*CLI, "capture", "-o", str(tmp_path / "r2"), "--", str(bare), str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{bare}: neuron_explorer is not installed" in proc.stderr
