"""`neuron_explorer.trace_handler`: torch.profiler's on_trace_ready that writes a Neuron Explorer profile.

Same contract as `torch.profiler.tensorboard_trace_handler`: pass it as `on_trace_ready`, and
each completed active cycle becomes one output. Ours is a profile directory: the first cycle
writes `dir_name` itself (or `dir_name/worker_name`), later cycles `<that>.cycle2`,
`<that>.cycle3`, ... beside it. With several torch.distributed ranks and no worker name, every
rank's cycle lands in the same profile, partitioned by rank (model/combine.py). A rerun replaces an earlier profile of the same name; a path
that exists and is not a profile is never touched.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ExplorerError
from ..importers.assemble import Assembled
from ..model import combine as ranks
from ..model import rank_parts
from ..model.io import ProfileWriter
from ..model.profile import is_profile
from ..model.schema import STACKS, conform
from . import sources
from .device_trace import drop_plugin_events
from .ending import exiting_exception, run_ended, sigterm_deferred
from .host import without_own_frames
from .merge import in_window, merge, whole

WINDOW_SLACK_NS = 1_000_000  # runtime events this close outside the trace's span still count


@dataclass(frozen=True)
class RawCapture:
    """What one active cycle left behind, before it is merged into a profile."""

    workdir: Path  # temporary; holds the exported Kineto trace
    trace: Path
    runtime: Sequence[
        Any
    ]  # backend RuntimeEvents drained for this cycle (events.drain()'s: dropped once written)
    device_spec: dict[str, Any] | None
    roots: tuple[str, ...]  # where user source files may be copied from
    torch_version: str
    graphs: dict[str, tuple] = field(default_factory=dict)  # compiled graphs' rows, by key


def _runtime_module() -> Any | None:
    """neuron_explorer.backend.runtime.events if the neuron device is registered in this process, else None."""
    if "neuron_explorer.backend" not in sys.modules:
        return None
    try:
        from neuron_explorer.backend.runtime import events
    except ImportError:
        return None
    return events


def _backend_state() -> tuple[dict[str, Any] | None, ...]:
    """(the shapes-only mode's assumptions and placeholders where this process used it, the
    device memory's peak since the process began or the last reset_peak_memory_stats() with
    what held it (None when nothing was allocated), the modeled job's ranks where it models
    one, the run-queue delay cut from its host clock)."""
    from neuron_explorer.backend import model_ranks
    from neuron_explorer.backend.runtime import hostcost, memory, shapes

    held = memory.held_at_peak()
    peak = held.pop("peak")
    block = {"peak_bytes": peak, "held_bytes": held} if peak > 0 else None
    return shapes.manifest(), block, model_ranks.manifest(), hostcost.captured_run_queue()


def grouped_matmul_extra(drained: Sequence[Any]) -> dict[str, Any]:
    """The manifest's `grouped_matmul` where kernels of `drained` priced a grouped matmul: its
    groups are uniform routing's (the offsets are data, a kernel is priced by its shapes)."""
    from neuron_explorer.backend.library_kernels import uniform_groups

    kernels = uniform_groups(drained)
    return {"grouped_matmul": {"groups": "uniform", "kernels": kernels}} if kernels else {}


def _device_spec() -> dict[str, Any] | None:
    """The spec the runtime modeled the capture with: the chip's, its host costs as measured
    in this process (runtime/hostcal.py)."""
    try:
        from neuron_explorer.backend.runtime import model

        return model.spec().to_dict()
    except Exception:  # noqa: BLE001 - a missing or broken cost model leaves the spec out
        return None


def _neff_graphs(drained: Sequence[Any]) -> dict[str, tuple]:
    """The graphs the drained kernels of compiled programs were lowered from, by key."""
    keys = {e.args["neff_graph"] for e in drained if e.kind == "kernel" and e.args
            and e.args.get("neff_graph")}  # fmt: skip
    if not keys:
        return {}
    from neuron_explorer.backend.graph_lowering import recorded_graphs

    return recorded_graphs(keys)


def graph_columns(graphs: dict[str, tuple], events: Sequence[Any]) -> dict[str, list] | None:
    """The `graphs` table of the graphs that `events` (RuntimeEvents) name; None for none."""
    named = {e.args.get("neff_graph") for e in events if e.kind == "kernel" and e.args}
    cols: dict[str, list] = {c: [] for c in ("graph", "op_index", "op", "inputs", "outputs",
                                              "sources", "exported")}  # fmt: skip
    for key in sorted(named.intersection(graphs)):
        for i, row in enumerate(graphs[key]):  # (op, inputs, outputs, sources, exported)
            for c, v in zip(cols.values(), (key, i, *row), strict=True):
                c.append(v)
    return cols if cols["graph"] else None


def _roots() -> tuple[str, ...]:
    roots = [os.getcwd()]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    for f in (main_file, sys.argv[0] if sys.argv else None):
        if f and os.path.isfile(f):
            roots.append(os.path.dirname(os.path.abspath(f)))
    return tuple(dict.fromkeys(roots))


class TraceHandler:
    """Callable for `on_trace_ready`; `written` lists the profiles made so far."""

    def __init__(
        self, dir_name: str | os.PathLike, worker_name: str | None = None, use_gzip: bool = False
    ) -> None:
        base = Path(dir_name)
        # the ranks of a torch.distributed job write one profile together (model/combine.py);
        # the job is known at write time (capture starts before the script's init_process_group)
        self.by_rank = not worker_name
        self.base = base / worker_name if worker_name else base
        self.use_gzip = use_gzip  # tensorboard_trace_handler's; profiles are zstd Parquet anyway
        self.cycles = 0
        self.written: list[Path] = []
        self.extra: dict[str, Any] = {}  # added to each manifest's extra (the capture command)
        self._check(self.base)
        launched = _launched_rank()
        if self.by_rank and launched is not None:  # present in the job from now on (rank_parts)
            _attend(self.base, launched)

    @staticmethod
    def _check(path: Path) -> None:
        if path.exists() and not is_profile(path) and (not path.is_dir() or any(path.iterdir())):
            raise ExplorerError(f"{path}: exists and is not a profile; choose another name")

    def path_for(self, cycle: int) -> Path:
        return self.base if cycle <= 1 else self.base.with_name(f"{self.base.name}.cycle{cycle}")

    def collect(self, prof: Any) -> RawCapture:
        """Export the cycle's trace and drain the runtime's events (cheap; no merging yet)."""
        workdir = Path(tempfile.mkdtemp(prefix="neuron-explorer-capture-"))
        trace = workdir / "trace.json"
        try:
            prof.export_chrome_trace(str(trace))
        except BaseException:  # e.g. "Trace is already saved": nothing of this cycle is kept
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        runtime = _runtime_module()
        drained = runtime.drain() if runtime is not None else []
        exc = exiting_exception()  # the `with profile(...)` block is ending in an exception
        if exc is not None:
            self.extra["run_ended"] = run_ended(exc)
        if drained:
            shapes_only, held, modeled, queued = _backend_state()
            # the simulating machine's preemptions cut from the host clock (docs/device.md)
            self.extra["run_queue"] = queued
            if shapes_only is not None:  # a profile without numerics says so, and its assumptions
                self.extra["shapes_only"] = shapes_only
            if held is not None:  # the device memory's peak and what held it
                self.extra["device_memory"] = held
            if modeled is not None:  # which ranks ran and which are copies of them
                self.extra["model_ranks"] = modeled
            self.extra.pop("grouped_matmul", None)
            self.extra.update(grouped_matmul_extra(whole(drained)))
        import torch

        return RawCapture(workdir, trace, drained, _device_spec() if drained else None,
                          _roots(), torch.__version__, _neff_graphs(whole(drained)))  # fmt: skip

    def discard(self, raw: RawCapture) -> None:
        shutil.rmtree(raw.workdir, ignore_errors=True)

    def write(self, raw: RawCapture) -> Path | None:
        """Merge a collected cycle into the next profile directory; returns its path.

        A profile that cannot be written is reported on stderr, not raised: this runs inside
        the training loop's `prof.step()`, and a failed profile must not end the training.
        """
        self.cycles += 1
        path = self.path_for(self.cycles)
        try:
            self._check(path)
            job = _distributed_job() if self.by_rank else None
            # only for a run that an exception is ending: then a launcher's SIGTERM follows
            # (a Python SIGTERM handler on every write made gloo's teardown hang now and then)
            ending = "run_ended" in self.extra
            with sigterm_deferred() if ending else contextlib.nullcontext():
                if job is None:
                    write_profile(raw, path, self.extra)
                else:
                    _write_rank(raw, path, self.extra, job)
        except (ExplorerError, OSError) as e:
            print(f"neuron-explorer: profile {path} not written: {e}", file=sys.stderr)
            return None
        except Exception as e:  # noqa: BLE001 - a bug of ours must not end the training either
            print(f"neuron-explorer: profile {path} not written: {failure(e)}", file=sys.stderr)
            return None
        finally:
            self.discard(raw)
        self.written.append(path)
        print(f"neuron-explorer: wrote profile {path}", file=sys.stderr)
        return path

    def __call__(self, prof: Any) -> Path | None:
        # a run an exception is ending: the launcher's SIGTERM may come while the trace is
        # still exported (a loaded machine's 2-rank crash lost its survivor's part there)
        ending = exiting_exception() is not None
        with sigterm_deferred() if ending else contextlib.nullcontext():
            try:
                raw = self.collect(prof)
            except Exception as e:  # noqa: BLE001 - raising into prof.step() can crash torch.profiler
                self.cycles += 1
                print(f"neuron-explorer: profile {self.path_for(self.cycles)} not written: "
                      f"{failure(e)}", file=sys.stderr)  # fmt: skip
                return None
            return self.write(raw)


def failure(e: BaseException) -> str:
    """An exception as one line for a 'not written' message."""
    text = str(e).strip().splitlines()
    return f"{e.__class__.__name__}: {text[0]}" if text else e.__class__.__name__


def trace_handler(
    dir_name: str | os.PathLike, worker_name: str | None = None, use_gzip: bool = False
) -> TraceHandler:
    """An `on_trace_ready` handler writing one profile directory per active cycle, with
    `torch.profiler.tensorboard_trace_handler`'s arguments."""
    return TraceHandler(dir_name, worker_name, use_gzip)


@dataclass(frozen=True)
class Job:
    """This process's place in a torch.distributed job of several ranks."""

    rank: int
    world_size: int
    run_id: str


def _distributed_job() -> Job | None:
    """The job when several torch.distributed ranks run (they then share one profile): from the
    process group, else from the launcher's RANK / WORLD_SIZE (torchrun sets them), which stay
    after the script's destroy_process_group()."""
    if os.environ.get("NEURON_EXPLORER_MODEL_RANKS"):  # one process models the job: one rank
        return None
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id == "none":  # torchrun's static rendezvous names no run
        run_id = "{}:{}".format(
            os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
        )
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            if dist.get_world_size() > 1:
                return Job(dist.get_rank(), dist.get_world_size(), run_id)
            return None
    except (RuntimeError, ValueError):
        pass
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return Job(rank, world, run_id) if world > 1 and 0 <= rank < world else None


def _launched_rank() -> int | None:
    """This process's rank when a launcher (torchrun) started it as one of several."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if os.environ.get("NEURON_EXPLORER_MODEL_RANKS") or not 0 <= rank < world or world < 2:
        return None
    return rank


def _attend(path: Path, rank: int) -> None:
    """This process present in the job writing `path`; where the folder takes no lock (some
    network file systems), the job's profile waits for its last part or for `capture`."""
    try:
        rank_parts.attend(path, rank)
    except OSError as e:
        print(f"neuron-explorer: {ranks.parts_dir(path)}: no lock ({e})", file=sys.stderr)


def _write_rank(raw: RawCapture, path: Path, extra: dict[str, Any], job: Job) -> None:
    """This rank's part, then the job's profile if this part completes it or no other rank of
    the job is still present (model/rank_parts.py)."""
    _attend(path, job.rank)
    part = ranks.part_path(path, job.rank)
    part.parent.mkdir(parents=True, exist_ok=True)
    with rank_parts.writing(path, job.rank):  # a few ranks at a time (model/rank_parts.py)
        write_profile(raw, part, extra)
        if hasattr(raw.runtime, "clear"):  # written: the rank that assembles needs none of it
            raw.runtime.clear()
        release_memory()  # the rank that assembles the job starts from its step's memory
    rank_parts.part_landed(path, job.world_size, job.run_id, job.rank)


def release_memory() -> None:
    """Give the heap's free pages back to the system: what merging a step's events freed stays
    in glibc's arenas and Arrow's pool otherwise (a real-size shapes-only rank kept 0.3 GiB)."""
    import ctypes

    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _host_events(trace: Path) -> Assembled:
    """torch.profiler's exported trace mapped to the profile's tables, in memory (one pass:
    no profile of the host events alone is written and read back)."""
    from ..importers.assemble import assemble
    from ..importers.kineto import load

    # host lanes by thread id: the runtime's calls are recorded as "thread <tid>" and nest in them
    return assemble([load(trace, thread_names=False)])


def write_profile(raw: RawCapture, path: Path, extra: dict[str, Any] | None = None) -> Path:
    """Merge host and runtime events of one cycle and write the profile atomically."""
    drop_plugin_events(raw.trace)  # the neuron Kineto plugin's: the merge places the same records
    host = _host_events(raw.trace)
    manifest = host.manifest
    origin = manifest.origin_unix_ns
    events = host.events()
    if events.num_rows:  # the trace's real span, a little wider
        start = pc.min(events.column("start_ns")).as_py()
        end = pc.max(pc.add(events.column("start_ns"), events.column("dur_ns"))).as_py()
        runtime = in_window(raw.runtime, origin + start - WINDOW_SLACK_NS,
                            origin + end + WINDOW_SLACK_NS)  # fmt: skip
    else:
        runtime = []
    events, stacks = without_own_frames(events, host.stacks)
    first_stack = int(pc.max(stacks.column("stack_id")).as_py()) + 1 if stacks.num_rows else 0
    merged = merge(events, origin, runtime, first_stack_id=first_stack)
    if merged.stacks.num_rows:
        stacks = pa.concat_tables(
            [conform(STACKS, stacks), merged.stacks], promote_options="permissive"
        ).unify_dictionaries()
    counters = host.counters
    if merged.counters.num_rows:
        counters = pa.concat_tables([counters, merged.counters]).unify_dictionaries()
    with ProfileWriter(path, overwrite=True) as writer:
        writer.write_events(merged.events)
        writer.write_table("stacks", stacks)
        writer.write_table("counters", counters)
        graphs = graph_columns(raw.graphs, whole(runtime))
        if graphs is not None:  # what `whatif --chip` lowers again (costmodel/graph_record.py)
            writer.write_table("graphs", graphs)
        files = sources.named_files(merged.events, stacks)
        kept = sources.select(files, [*raw.roots, *sources.library_roots()])
        for file, text in kept.kept:
            writer.add_source(file, text)
        final = replace(
            manifest,
            source="capture",
            producer="",
            device_spec=raw.device_spec,
            torch_version=raw.torch_version,
            host=manifest.host or platform.node(),
            steps=merged.steps,
            inputs=(),
            extra={
                **manifest.extra,
                **(extra or {}),
                "simulator_ns_removed": merged.removed_ns,
                "simulator_ns_before": merged.cut_before_ns,  # model/combine.py's shared clock
                **kept.manifest_extra(),
            },  # fmt: skip
        )
        return writer.commit(final)
