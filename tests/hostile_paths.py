"""Hostile profile folders and traces for issue 29 (a server that stays inside), made on the
spot so no hostile binary is committed. Each profile is a real import of a small Kineto trace,
then bent the way a tarball from elsewhere can bend it: a line number of 2**31 - 1, a
`sources/` that is itself a link (to / or to a folder outside), tables and the manifest linked
out of the profile, a counter whose unit is HTML, event names with a right-to-left override,
a trace saved in a Downloads folder whose parent holds Python files.

    python tests/hostile_paths.py OUT     # writes OUT/served, OUT/outside, OUT/home

Every secret planted outside the served folder holds TOKEN, so a test only has to look for it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TOKEN = "NE-PLANTED-7f3a9c2e"  # in every planted secret, and in the server's environment
TOKEN_ENV = "NE_HOSTILE_TOKEN"
HUGE_LINE = 2**31 - 1  # the largest int32 line number a profile's tables can hold
RAW_HUGE_LINE = 2_000_000_000  # as a raw trace's frame names it
LINK = '<a href="https://evil.example/" target="_blank">click me</a>'
BIG = '<span style="font-size:90px">HUGE</span>'
BIDI_NAME = "aten::evil\u202egnp.py"
TRAIN_PY = "import torch\n\n\ndef step(x):\n    return x.mm(x)\n"  # five lines


def trace(path: Path, frames: list[str], ops: list[str] | None = None) -> Path:
    """A Kineto trace: one step, one python frame per name (nested, outermost first) and the
    ops inside the innermost (aten::mm by default)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
               "tid": 1, "ts": 1000, "dur": 900, "args": {}}]  # fmt: skip
    for i, name in enumerate(frames):
        events.append({"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1,
                       "ts": 1001 + i, "dur": 800 - 2 * i,
                       "args": {"Python id": i + 1, "Python parent id": i}})  # fmt: skip
    for k, op in enumerate(ops or ["aten::mm"]):
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1,
                       "ts": 1100 + 60 * k, "dur": 50, "args": {}})  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}))
    return path


@dataclass(frozen=True)
class Hostile:
    """Where make() put things: the served folder, the folder outside it that holds the
    planted secrets, and the raw traces to serve directly."""

    served: Path
    outside: Path
    home: Path
    raw_huge_line: Path  # train.py(2000000000): step, beside a short train.py
    downloads_trace: Path  # home/Downloads/run.pt.trace.json; home/ holds settings.py

    def profile(self, name: str) -> Path:
        return self.served / name


# profile name -> what is bent in it
PROFILES = {
    "huge-line": "events and stacks name train.py line 2**31 - 1; train.py has five lines",
    "sources-to-root": "sources/ is a link to /; the profile names /etc/passwd and /proc/self/environ",
    "sources-out": "sources/ is a link to a folder outside holding secret.py",
    "source-file-out": "sources/secret.py is a link to a file outside",
    "source-fifo": "sources/secret.py is a named pipe (opening it to read blocks)",
    "source-huge": "sources/secret.py is a 9 MB file (past what the server reads)",
    "events-out": "events.parquet is a link to a table outside whose op names hold TOKEN",
    "events-dir-out": "events/ (a dataset folder) is a link to a folder outside",
    "stacks-out": "stacks.parquet is a link to a table outside",
    "counters-out": "counters.parquet is a link to a table outside",
    "manifest-out": "manifest.json is a link to a manifest outside holding TOKEN",
    "unit-html": "a memory counter whose unit is a link and a 90 px span",
    "bidi": "op names with a right-to-left override",
}


def make(base: Path) -> Hostile:
    """Write every hostile profile under base/served, its secrets under base/outside."""
    from neuron_explorer.importers import import_traces

    served, outside, home, work = (base / n for n in ("served", "outside", "home", "work"))
    for d in (served, outside, home, work):
        d.mkdir(parents=True, exist_ok=True)
    (outside / "secret.py").write_text(f"TOKEN = {TOKEN!r}\n")
    (work / "train.py").write_text(TRAIN_PY)

    # a line number no file has, in events (src_line) and stacks (line)
    t = trace(work / "huge.pt.trace.json", [f"train.py({HUGE_LINE}): step"])
    import_traces([t], served / "huge-line", source_roots=[work])
    raw = trace(base / "raw" / "huge.pt.trace.json", [f"train.py({RAW_HUGE_LINE}): step"])
    (raw.parent / "train.py").write_text(TRAIN_PY)

    # profiles that name files outside, then have their sources/ pointed there
    named = trace(work / "named.pt.trace.json",
                  ["/etc/passwd(1): f", "/proc/self/environ(1): g", "/secret.py(1): h"])  # fmt: skip
    plain = import_traces([named], work / "plain", source_roots=[work])
    for name, target in (("sources-to-root", Path("/")), ("sources-out", outside)):
        shutil.copytree(plain, served / name)
        shutil.rmtree(served / name / "sources", ignore_errors=True)
        os.symlink(target, served / name / "sources")
    shutil.copytree(plain, served / "source-file-out")
    (served / "source-file-out" / "sources").mkdir(exist_ok=True)
    os.symlink(outside / "secret.py", served / "source-file-out" / "sources" / "secret.py")

    for name in ("source-fifo", "source-huge"):
        shutil.copytree(plain, served / name)
        (served / name / "sources").mkdir(exist_ok=True)
    os.mkfifo(served / "source-fifo" / "sources" / "secret.py")
    with open(served / "source-huge" / "sources" / "secret.py", "wb") as f:
        f.truncate(9 << 20)  # sparse: no disk written

    # tables and the manifest linked out: the targets are real tables holding TOKEN
    tokened = trace(work / "tokened.pt.trace.json", ["train.py(4): step"], [f"aten::{TOKEN}"])
    secret = import_traces([tokened], outside / "secret-profile", source_roots=[work])
    for table in ("events", "stacks", "counters"):
        name = f"{table}-out"
        shutil.copytree(plain, served / name)
        (served / name / f"{table}.parquet").unlink()
        os.symlink(secret / f"{table}.parquet", served / name / f"{table}.parquet")
    shutil.copytree(plain, served / "events-dir-out")
    (served / "events-dir-out" / "events.parquet").unlink()
    (outside / "events-dataset" / "rank=0").mkdir(parents=True)
    shutil.copy(secret / "events.parquet", outside / "events-dataset" / "rank=0" / "part-0.parquet")
    os.symlink(outside / "events-dataset", served / "events-dir-out" / "events")
    manifest = json.loads((secret / "manifest.json").read_text())
    manifest["extra"] = {**manifest.get("extra", {}), "planted": TOKEN}
    (outside / "manifest.json").write_text(json.dumps(manifest))
    shutil.copytree(plain, served / "manifest-out")
    (served / "manifest-out" / "manifest.json").unlink()
    os.symlink(outside / "manifest.json", served / "manifest-out" / "manifest.json")

    # what reaches the page: a counter's unit, a name with a bidi override
    shutil.copytree(plain, served / "unit-html")
    _write_counters(served / "unit-html", unit=LINK + BIG)
    t = trace(work / "bidi.pt.trace.json", ["train.py(4): step"], [BIDI_NAME, "aten::mm"])
    import_traces([t], served / "bidi", source_roots=[work])

    # a trace saved in ~/Downloads: the home folder above it holds Python files
    (home / "settings.py").write_text(f"API_KEY = {TOKEN!r}\n")
    downloads = trace(home / "Downloads" / "run.pt.trace.json", ["settings.py(1): load"])
    return Hostile(served, outside, home, raw, downloads)


def _write_counters(profile: Path, unit: str) -> None:
    """Replace a profile's counters with a memory_allocated curve in `unit`."""
    from neuron_explorer.model.schema import COUNTERS, conform

    n = 8
    data = {"rank": [0] * n, "track": ["cuda:0"] * n, "name": ["memory_allocated"] * n,
            "ts_ns": [1000 * 1000 + 100 * 1000 * i for i in range(n)],
            "value": [float(1 << 20) * (1 + i % 4) for i in range(n)], "unit": [unit] * n}  # fmt: skip
    table = conform(COUNTERS, pa.table(data))
    pq.write_table(table, profile / "counters.parquet", compression="zstd")
    m = json.loads((profile / "manifest.json").read_text())
    m["row_counts"] = {**m.get("row_counts", {}), "counters": n}
    (profile / "manifest.json").write_text(json.dumps(m))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/hostile_paths.py OUT")
    made = make(Path(sys.argv[1]))
    for name, what in PROFILES.items():
        print(f"{made.profile(name)}: {what}")
    print(f"{made.raw_huge_line}: a raw trace naming line {RAW_HUGE_LINE}")
    print(f"{made.downloads_trace}: a raw trace in a Downloads folder; {made.home}/settings.py")
