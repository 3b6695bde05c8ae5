"""`torch.profiler.profile` as a script run by `neuron-explorer capture` sees it.

It is the real profiler: the script's schedule, on_trace_ready, key_averages() and tables work
as written. torch runs one profiler at a time, so when the script's profiler starts, capture's
own ends (its recording so far is kept only as a fallback), and each cycle the script's
profiler completes is also written as our profile before the script's own handler runs.

Kineto saves a cycle's trace once ("Trace is already saved" after that), so the trace capture
exports is kept on disk until the run ends, and the script's `export_chrome_trace(path)` copies
it, whenever the script calls it (in its handler or after the `with` block).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .kineto_stderr import kineto_lines_filtered


class KeptTraces:
    """Cycle traces kept for the script's own exports; removed when the captured run ends."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._count = 0

    def keep(self, trace: Path) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="neuron-explorer-traces-"))
        self._count += 1
        kept = self._dir / f"cycle{self._count}.json"
        try:
            os.link(trace, kept)  # same file system: no copy of a large trace
        except OSError:
            shutil.copyfile(trace, kept)
        return kept

    def remove(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def copy_trace(saved: Path, path: str | os.PathLike) -> None:
    """The saved JSON trace at `path`, gzipped when the name ends in .gz (as torch does)."""
    if str(path).endswith(".gz"):
        with open(saved, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(saved, path)


def script_profiler_class(controller: Any, base: type) -> type:
    """A subclass of `base` (torch.profiler.profile) driving `controller` (a StepController)."""

    class ScriptProfile(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, on_trace_ready: Any = None, **kwargs: Any) -> None:
            self._script_on_trace_ready = on_trace_ready
            self._saved_trace: Path | None = None
            # Always a handler, so capture sees every cycle, even when the script gives none.
            super().__init__(*args, on_trace_ready=self._cycle_ready, **kwargs)

        def _cycle_ready(self, prof: Any) -> None:
            raw = controller.collect_script_cycle(prof)
            self._saved_trace = controller.kept_traces.keep(raw.trace) if raw else None
            try:
                if self._script_on_trace_ready is not None:
                    self._script_on_trace_ready(prof)
            finally:
                if raw is not None:
                    controller.write_script_cycle(raw)

        def export_chrome_trace(self, path: str, use_python_export: bool = False) -> Any:
            # torch 2.13's tensorboard_trace_handler passes use_python_export by keyword
            if self._saved_trace is None:
                return super().export_chrome_trace(path, use_python_export=use_python_export)
            copy_trace(self._saved_trace, path)
            return None

        def start(self) -> None:
            self._saved_trace = None
            controller.step_aside()
            with kineto_lines_filtered():
                super().start()

        def stop(self) -> None:
            with kineto_lines_filtered():
                super().stop()

        def step(self) -> None:
            controller.markers += 1
            with kineto_lines_filtered():
                super().step()

    ScriptProfile.__name__ = ScriptProfile.__qualname__ = base.__name__
    ScriptProfile.__module__ = base.__module__
    return ScriptProfile
