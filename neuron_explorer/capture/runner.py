"""Run a Python script under the profiler with no change to it (`neuron-explorer capture`).

The script runs in this process as `python script.py ARGS` would run it. Steps come from
`optimizer.step()` calls; with none, the whole run is one step. A script that makes its own
`torch.profiler.profile(...)` keeps it working as written (its schedule, its on_trace_ready,
key_averages): torch runs one profiler at a time, so capture steps aside when the script's
profiler starts and writes a profile of each cycle that profiler records (up to --repeat).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ExplorerError
from .ending import run_ended
from .kineto_stderr import kineto_lines_filtered
from .script_profiler import KeptTraces, script_profiler_class


@dataclass(frozen=True)
class Schedule:
    """Steps to skip, to warm the profiler up on, and to record, per cycle."""

    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1


@dataclass(frozen=True)
class CaptureResult:
    """How a captured run ended: the script's exit status and the profiles written."""

    exit_code: int
    profiles: tuple[Path, ...] = ()
    steps_seen: int = 0
    step_source: str = "none"  # none | optimizer | profiler


def parse_command(command: Sequence[str]) -> tuple[str, list[str], bool]:
    """(target, argv, is_module) from `python script.py ARGS`, `script.py ARGS` or
    `python -m module ARGS`."""
    args = list(command)
    if args and Path(args[0]).name.startswith("python") and not args[0].endswith(".py"):
        args = args[1:]
    while args and args[0] in ("-u", "-B", "-O"):  # interpreter flags with no effect here
        args = args[1:]
    if not args:
        raise ExplorerError("capture: no script given (usage: capture -o DIR -- python SCRIPT ...)")
    if args[0] == "-m":
        if len(args) < 2:
            raise ExplorerError("capture: -m needs a module name")
        return args[1], [args[1], *args[2:]], True
    if args[0].startswith("-"):
        raise ExplorerError(f"capture: unsupported interpreter option {args[0]}")
    script = Path(args[0])
    if not script.is_file():
        raise ExplorerError(f"{script}: no such script")
    return str(script.resolve()), args, False  # python 3.9+ runs __main__ by absolute path


class StepController:
    """Drives torch.profiler's schedule from step markers seen while the script runs.

    Step 0 is recorded from the start, so a run with no markers is captured whole; once a
    marker arrives, that first recording is only kept as a fallback in case no scheduled cycle
    completes (the script ran fewer steps than wait + warmup + 1).
    """

    def __init__(self, schedule: Schedule, handler) -> None:  # a TraceHandler
        from torch.profiler import ProfilerAction
        from torch.profiler import schedule as torch_schedule

        self.actions = ProfilerAction
        self.plan = torch_schedule(
            wait=schedule.wait,
            warmup=schedule.warmup,
            active=schedule.active,
            repeat=schedule.repeat,
        )
        self.handler = handler
        self.repeat = schedule.repeat
        self.prof: Any = None  # the torch.profiler.profile it drives
        self.markers = 0
        self.source = "none"
        self.fallback = None  # collected step-0 capture, written only if nothing else is
        self.cycle_start = 0
        self.step_optimizer: object | None = None
        self.exiting = False
        self._last: Any = None  # the last ProfilerAction returned
        self.written: list[Path] = []
        self.stepped_aside = False  # the script's own profiler took over
        self.script_cycles = 0
        self.kept_traces = KeptTraces()  # the script's cycles, for its own export_chrome_trace
        self.collected = False  # a cycle was collected in the last step: give its memory back

    def schedule(self, step: int):  # a ProfilerAction
        action = self.actions.RECORD_AND_SAVE if step == 0 else self.plan(step)
        recording = (self.actions.RECORD, self.actions.RECORD_AND_SAVE)
        if action in recording and self._last not in (self.actions.RECORD,):
            self.cycle_start = step  # a new recording cycle begins with this step
        self._last = action
        return action

    def on_trace_ready(self, prof) -> None:  # torch.profiler.profile
        # This runs inside the script's prof.step() / optimizer.step(): an exception raised here
        # would end the script, and one raised through torch.profiler's step can crash it later.
        try:
            self._trace_ready(prof)
        except Exception as e:  # noqa: BLE001
            from .handler import failure

            print(
                f"neuron-explorer: a profile cycle was not written: {failure(e)}", file=sys.stderr
            )

    def _trace_ready(self, prof) -> None:  # torch.profiler.profile
        # what the cycle held (torch.profiler's records, the first use's lowering) is freed
        # after this returns, then kept in glibc's arenas unless given back: a 32-layer
        # Llama-3-8B rank's first step, 0.1 GiB held to its end (docs/device.md)
        self.collected = True
        if self.stepped_aside:
            # What ran before the script's profiler started: only a fallback, like step 0.
            raw = self.handler.collect(prof)
            if self.fallback is None and not self.written:
                self.fallback = raw
            else:
                self.handler.discard(raw)
            return
        if self.markers and prof.step_num == 1 and self.fallback is None and not self.written:
            # The step-0 recording, ended by the first marker: kept only as a fallback.
            self.fallback = self.handler.collect(prof)
            return
        if self.exiting and self.fallback is not None and prof.step_num == self.cycle_start:
            # The script ended before this cycle saw a whole step: the fallback is better.
            self.handler.discard(self.handler.collect(prof))
            return
        path = self.handler(prof)
        if path is not None:
            self.written.append(path)

    def optimizer_stepped(self, optimizer: object, *_: object) -> None:
        """Post-hook of every optimizer.step(): only the first optimizer seen marks steps, so a
        loop stepping two optimizers (a GAN, an encoder and a decoder) counts one step."""
        if self.step_optimizer is None:
            self.step_optimizer = optimizer
        if optimizer is self.step_optimizer:
            self.marker("optimizer")

    def marker(self, source: str) -> None:
        """A step boundary: `source` is "optimizer" or "profiler"; the script's profiler wins."""
        if self.prof is None:
            return
        if source == "optimizer" and self.source == "profiler":
            return
        self.source = source
        self.markers += 1
        # Shapes from the first scheduled cycle on: torch.profiler's record_shapes holds weak
        # references to tensors, which breaks model.to("neuron") (a parameter swap) in setup.
        self.prof.record_shapes = True
        with warnings.catch_warnings(), kineto_lines_filtered():
            warnings.simplefilter("ignore")
            self.prof.step()
        if self.collected:  # torch.profiler let go of that cycle's records as the next began
            from .handler import release_memory

            self.collected = False
            release_memory()

    def step_aside(self) -> None:
        """The script's own profiler is starting: end ours (torch runs one at a time)."""
        if self.prof is None:
            return
        self.stepped_aside, self.source = True, "profiler"
        prof, self.prof = self.prof, None
        with warnings.catch_warnings(), kineto_lines_filtered():
            warnings.simplefilter("ignore")
            prof.__exit__(None, None, None)

    def collect_script_cycle(self, prof) -> Any:  # the script's profiler
        """A cycle the script's profiler completed, collected for our profile (up to `repeat`
        of them; None after that or if it cannot be collected)."""
        self.script_cycles += 1
        if self.script_cycles > self.repeat:
            return None
        try:
            return self.handler.collect(prof)
        except Exception as e:  # noqa: BLE001 - the script's own handler must still run
            from .handler import failure

            print(f"neuron-explorer: a profile cycle was not written: {failure(e)}",
                  file=sys.stderr)  # fmt: skip
            return None

    def write_script_cycle(self, raw: Any) -> None:
        path = self.handler.write(raw)  # reports its own failures on stderr
        if path is not None:
            self.written.append(path)

    def finish(self) -> None:
        if self.fallback is None:
            return
        if self.written:
            self.handler.discard(self.fallback)
        else:
            path = self.handler.write(self.fallback)
            self.written += [path] if path is not None else []
        self.fallback = None


def _set_profiler_class(torch: Any, cls: type) -> None:
    """What `torch.profiler.profile` names while the script runs (both public spellings)."""
    torch.profiler.profile = cls
    torch.profiler.profiler.profile = cls


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_script_error(exc: BaseException) -> None:
    """Print the traceback as `python script.py` would, without this runner's own frames."""
    tb = exc.__traceback__
    here = {__file__, runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in here:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


# What a torchrun rank's script left: its globals (what runpy returns) or the exception that
# ended it (its traceback holds the script's frames). They live until the rank's process exits,
# as a script's globals do under `python script.py`. A DDP model's last reference frees its
# process group (~ProcessGroupGloo joins gloo's run loop) with the GIL held, while that loop may
# be dropping a finished Work that needs the GIL: gdb showed both ranks hung after writing their
# profile. The Work held two Python objects: the one every backward() stashes in the
# thread-local state (now kept out of it: backend/runtime/work_tls.py) and a neuron tensor's
# payload (a C++ reference to a tensor with a Python object takes the GIL to drop). So the
# neuron backend holds each gloo group it makes until exit (backend/distributed.py), which
# covers a model that is a local of main(); this covers a group another backend made ("gloo")
# whose model is a global. At exit Python stops a thread that waits for the GIL. Not kept
# outside torchrun: a process that captures again (tests) frees them.
_SCRIPT_STATE: list[Any] = []


def _run_script(target: str, is_module: bool) -> None:
    """Run the script as `__main__`; a torchrun rank keeps what it leaves (_SCRIPT_STATE)."""
    try:
        if is_module:
            state = runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            state = runpy.run_path(target, run_name="__main__")
    except BaseException as exc:
        _keep(exc)
        raise
    _keep(state)


def _keep(state: Any) -> None:
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun rank: its process ends after this
        _SCRIPT_STATE.append(state)


def run_captured(
    command: Sequence[str], out: str | Path, schedule: Schedule = Schedule()
) -> CaptureResult:
    """Run `command` (python SCRIPT ARGS) under the profiler; write profiles under `out`."""
    target, argv, is_module = parse_command(command)
    import torch
    import torch.profiler
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from .handler import trace_handler

    handler = trace_handler(out)
    handler.extra["capture"] = {"command": list(command), "schedule": asdict(schedule)}
    controller = StepController(schedule, handler)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    profiler_class = torch.profiler.profile
    sys.argv = argv
    sys.path.insert(0, os.getcwd() if is_module else str(Path(target).resolve().parent))
    hook = register_optimizer_step_post_hook(controller.optimizer_stepped)
    prof = profiler_class(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=False,  # until the first step marker (see StepController.marker)
        schedule=controller.schedule,
        on_trace_ready=controller.on_trace_ready,
    )
    controller.prof = prof
    shim = script_profiler_class(controller, profiler_class)
    _set_profiler_class(torch, shim)
    exit_code = 0
    with kineto_lines_filtered():
        prof.__enter__()
    try:
        _run_script(target, is_module)
    except SystemExit as exc:
        exit_code = _exit_code(exc)
    except KeyboardInterrupt as exc:
        exit_code = 130
        print("KeyboardInterrupt", file=sys.stderr)
        handler.extra["run_ended"] = run_ended(exc)
    except ExplorerError as exc:  # the device refused what the script asked: one line, as the CLI
        print(f"neuron-explorer: error: {exc}", file=sys.stderr)
        exit_code = 2
        handler.extra["run_ended"] = run_ended(exc)
    except BaseException as exc:  # noqa: BLE001 - the script's error is shown, the profile kept
        _print_script_error(exc)
        exit_code = 1
        handler.extra["run_ended"] = run_ended(exc)  # the partial profile says what ended it
    finally:
        _set_profiler_class(torch, profiler_class)
        hook.remove()
        sys.stdout.flush()
        controller.exiting = True
        try:
            if not controller.stepped_aside:
                with warnings.catch_warnings(), kineto_lines_filtered():
                    warnings.simplefilter("ignore")
                    prof.__exit__(None, None, None)
            controller.finish()
        finally:
            controller.kept_traces.remove()
            controller.prof = None
            sys.argv, sys.path[:] = saved_argv, saved_path
    return CaptureResult(
        exit_code, tuple(controller.written), controller.markers, controller.source
    )
