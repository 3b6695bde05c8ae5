"""The MCP tools: each answers with the web's /api/ document for the same question (api.py), cut
to a bounded size (bound.py). A tool's description says what it returns and in which units, so
an agent can find a bottleneck and the line to change without reading our docs first."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from .api import Api, Refused, segment
from .bound import MAX_CHARS, bound, size

Tool = Callable[..., Awaitable[dict[str, Any]]]

UNITS = (
    " Times are integer nanoseconds (*_ns) on one clock since the profile's origin; shares and "
    "utilizations are fractions 0-1. When device_time_modeled is true, device times come from "
    "the Trainium cost model, not from a measurement."
)
MAX_CONTEXT_LINES = 50
MAX_WIDTH_PX = 2000
MIN_WIDTH_PX = 50  # the web's own floor
SQL_ROWS = 200  # an agent's default: enough to answer, small enough to read


def _slice(rows: Any, n: int) -> Any:
    return rows[: max(1, int(n))] if isinstance(rows, list) else rows


DESCRIPTIONS: dict[str, str] = {  # tool name -> what it returns, in the order agents use them
    "list_profiles": (
        "The profiles this server serves, each with name, source (capture: a run on the "
        "modeled neuron device; kineto: an imported torch.profiler trace), ranks, devices, "
        "steps (the step statistics: count, total_ns, mean_ns, median_ns, min_ns, max_ns, "
        "partial_last_steps; null without steps), events and its top finding. Start here: every other tool "
        "takes one of these names."
    ),
    "summary": (
        "One profile's overview: manifest (source, ranks, devices, device spec, row counts), "
        "per-step times, the summary (breakdown of step time into device compute, DMA, "
        "device idle, compile, CPU fallback, host sync and other host time; engine "
        "utilization; MFU and MBU; for neuron the readiness block: fallback ops, float64 "
        "downcasts, recompiles and host syncs with their lines), the top 5 findings, the "
        "top ops and the top source lines."
    ),
    "findings": (
        "The rules' findings, porting problems (category readiness) first, then performance, "
        "each ranked by estimated saving (saving_ns; saving_share of total step time): title, "
        "detail, fix, severity and evidence (event_ids for the event tool, ops, source_lines "
        "with file and line for source_line, and the rule's metrics). Filter by category "
        "(readiness | performance) or rule id; limit caps the list (findings_total says how "
        "many matched)."
    ),
    "sql": (
        "One read-only DuckDB SELECT over the profile's tables events, stacks, counters and graphs "
        "(columns and their meanings: the resource neuron-explorer://schema). No file can be "
        "read or written; at most `limit` rows (capped at 10,000) come back, and a query "
        "running past the time limit is stopped. Returns columns, types, rows (lists), "
        "row_count, truncated and elapsed_ms."
    ),
    "timeline": (
        "The events overlapping [start_ns, end_ns) (the whole profile when omitted), reduced "
        "on the server for a view width_px wide (50-2000; narrowed until the answer fits): rects are columns (lane, depth, "
        "start_ns, dur_ns, id, count, kind, name as an index into names); a rect with count "
        "> 1 merges that many short events on one lane. lanes says which host thread or "
        "device track each lane is; steps gives each step's start_ns and dur_ns."
    ),
    "event": (
        "One event in full by id (from findings evidence, timeline rects or sql): its "
        "columns (kind, name, track, start_ns, dur_ns, op_name, shapes, dtypes, flops, bytes; "
        "module: the nn.Module path; model_file/model_line: the innermost frame in model "
        "code, library files included), its enclosing events (ancestors), children, flow "
        "partners (the host launch and the device work it caused), its source line (the "
        "innermost user frame), and its whole Python stack (innermost frame first, each "
        "frame's scope: user, library, torch, stdlib, builtin)."
    ),
    "source_line": (
        "A source line with its time: host_ns (host time of the ops at the line), device_ns "
        "(device time of the work they launched), ops and launches for the line and the "
        "`context` lines around it with their code (from the profile's own copy of the "
        "file), and the ops and longest events at the line. `file` is the path as findings "
        "and hotspots give it, or its file_id."
    ),
    "hotspots": (
        "Where the time is in the code: top_lines (the user's lines: file, line, func, "
        "host_ns, device_ns, ops, launches) and files ranked by time; top_model_lines and "
        "model_files (device self_ns and total_ns per line of every file in the stacks, "
        "library modeling files included); modules (nn.Module paths by device self time: "
        "self_ns, total_ns, forward_ns, backward_ns, calls, kernels); lines_by_level "
        "(device time per line at `level`: model (default), user or all frames; self_ns "
        "where the line is the innermost frame of that level, total_ns anywhere in the "
        "stack). n caps each list."
    ),
    "operators": (
        "The operator table: each framework op's calls, host total and self time, device "
        "time, FLOPs, bytes, arithmetic intensity (FLOP/byte) and achieved FLOP/s, with the "
        "device's roofline peaks; with `op`, that op's kernels, instructions and DMAs and the "
        "source lines that call it."
    ),
    "compare": (
        "Two profiles side by side (a is the baseline, b the new run), as `neuron-explorer "
        "diff a b --json` prints it: step statistics of each, job_steps (each whole step "
        "as long as its slowest rank) and step_ns_delta (b minus a, of their medians), the "
        "breakdown with deltas, and ops, source lines, kernels and modules with their time "
        "in a and b, delta (ns, b minus a) and ratio, the largest change first (n of each); "
        "and the findings that appeared in b or went."
    ),
    "critical_path": (
        "The critical path of one step (the median step unless `step`; the slowest rank "
        "unless `rank`): the chain of host calls, device work and waits that sets the step's "
        "length. by_category splits it into host, device compute, dma, collective wait and "
        "transfer (ns); ops ranks what is on it (label, category, dur_ns, share of the step) "
        "with saving_if_2x_ns, the step's drop were that op twice as fast (a replay); "
        "segments lists the pieces in time order with their event_id (-1: host time outside "
        "any op) for the event tool. Only what is on the path makes the step faster."
    ),
    "whatif": (
        "Replay one step with changes applied and get the new step time: speedup is a comma "
        "list of NAME=FACTOR (an op or kernel, e.g. aten::mm=2; an op inside a compiled "
        "graph's fused kernels is sped up there), module=PATH:FACTOR, "
        "op=NAME:FACTOR, kernel=NAME:FACTOR or line=FILE:LINE:FACTOR; drop_syncs removes the "
        "host's waits for the device; chip (trn1, trn2, trn3) lowers each kernel again for "
        "another chip (neuron captures). Returns before_ns, after_ns, saving_ns, "
        "saving_share, each rank's before and after, events_changed and fused_kernels."
    ),
    "report": (
        "The pull-request report of a profile (optionally against a baseline profile): "
        "findings with their lines and fixes, the readiness block, the top lines and modules "
        "and the before/after deltas, as Markdown ready to paste, plus the same as JSON."
    ),
}


class ProfileTools:
    """The tools over one Api; each public coroutine method is one MCP tool (DESCRIPTIONS)."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def _name(self, name: str) -> str:
        """`name` checked and quoted for a URL path."""
        return segment(self.api.profile(name))

    async def list_profiles(self) -> dict[str, Any]:
        return await self.api.get("profiles")

    async def summary(self, profile: str) -> dict[str, Any]:
        return await self.api.get(f"p/{self._name(profile)}")

    async def findings(
        self, profile: str, category: str | None = None, rule: str | None = None, limit: int = 10
    ) -> dict[str, Any]:
        if category not in (None, "readiness", "performance"):
            raise Refused(f"category is readiness or performance, not {category!r}")
        doc = await self.api.get(f"p/{self._name(profile)}/findings")
        found = [
            f for f in doc.get("findings", [])
            if (category is None or f.get("category") == category) and (rule is None or f.get("rule") == rule)
        ]  # fmt: skip
        return {**doc, "findings_total": len(found), "findings": _slice(found, limit)}

    async def sql(self, profile: str, query: str, limit: int = SQL_ROWS) -> dict[str, Any]:
        return await self.api.get(f"p/{self._name(profile)}/sql", q=query, limit=limit)

    async def timeline(
        self,
        profile: str,
        start_ns: int | None = None,
        end_ns: int | None = None,
        width_px: int = 200,
    ) -> dict[str, Any]:
        name, width = self._name(profile), min(max(int(width_px), MIN_WIDTH_PX), MAX_WIDTH_PX)
        while True:  # a window too big to send is reduced further (halved width), not cut
            doc = await self.api.get(
                f"p/{name}/timeline", start_ns=start_ns, end_ns=end_ns, width_px=width
            )
            if size(doc) <= MAX_CHARS or width <= MIN_WIDTH_PX:
                return doc
            width = max(MIN_WIDTH_PX, width // 2)
            # the whole-profile view comes in a few cached widths: name the extent to narrow it
            start_ns = doc["extent"]["start_ns"] if start_ns is None else start_ns
            end_ns = doc["extent"]["end_ns"] if end_ns is None else end_ns

    async def _in_thread(self, name: str, work: Callable[[Any], Any]) -> Any:
        """`work(profile)` off the event loop, for the analysis functions no route serves yet
        (`name` as served, not URL-quoted)."""
        import anyio

        return await anyio.to_thread.run_sync(lambda: work(self.api.store.open(name)))

    async def event(self, profile: str, event_id: int) -> dict[str, Any]:
        return await self.api.get(f"p/{self._name(profile)}/events/{int(event_id)}")

    async def source_line(
        self, profile: str, file: str, line: int, context: int = 8
    ) -> dict[str, Any]:
        name, fid = self._name(profile), segment(self.api.file_id(file))
        detail = await self.api.get(f"p/{name}/source/{fid}/lines/{int(line)}")
        k = min(max(int(context), 0), MAX_CONTEXT_LINES)
        # only the window: a listing never runs to a line number the profile merely claims
        around = min(max(1, int(line)), 2**31 - 1)
        listing = await self.api.get(f"p/{name}/source/{fid}", around=around, context=k)
        near = listing["lines"]
        return {**detail, "has_source": listing["has_source"],
                "device_time_modeled": listing["device_time_modeled"],
                "this_line": next((r for r in near if r["line"] == int(line)), None),
                "listing": near}  # fmt: skip

    async def hotspots(self, profile: str, n: int = 20, level: str = "model") -> dict[str, Any]:
        from neuron_explorer.analysis.hotspots import LEVELS, line_hotspots

        if level not in LEVELS:
            raise Refused(f"level is one of {', '.join(LEVELS)}, not {level!r}")
        name, k = self._name(profile), max(1, int(n))
        doc = await self.api.get(f"p/{name}/source")
        tree = (await self.api.get(f"p/{name}/modules"))["modules"]
        heaviest = sorted((m for m in tree if m["self_ns"]), key=lambda m: -m["self_ns"])
        lines = await self._in_thread(
            self.api.profile(profile), lambda prof: line_hotspots(prof, level).to_pylist()[:k]
        )
        out = {
            key: _slice(value, k) if isinstance(value, list) else value
            for key, value in doc.items()
        }
        return {**out, "modules": heaviest[:k], "lines_by_level": {"level": level, "lines": lines}}

    async def operators(self, profile: str, op: str | None = None, n: int = 30) -> dict[str, Any]:
        name = self._name(profile)
        if op:
            return await self.api.get(f"p/{name}/operators/detail", op=op)
        doc = await self.api.get(f"p/{name}/operators")
        return {
            **doc,
            "operators_total": len(doc["operators"]),
            "operators": _slice(doc["operators"], n),
        }

    async def compare(self, a: str, b: str, n: int = 20) -> dict[str, Any]:
        for name in (a, b):  # refused here, by name, before the route reads either
            self.api.profile(name)
        doc = await self.api.get("compare", a=a, b=b)
        tables = ("ops", "lines", "kernels", "modules")
        return {**doc, **{t: _slice(doc.get(t, []), n) for t in tables}}

    async def critical_path(
        self, profile: str, step: int | None = None, rank: int | None = None, n: int = 20
    ) -> dict[str, Any]:
        doc = await self.api.get(f"p/{self._name(profile)}/critical-path", step=step, rank=rank)
        return {**doc, "ops": _slice(doc["ops"], n), "segments_total": len(doc["segments"]),
                "segments": _slice(doc["segments"], 200)}  # fmt: skip

    async def whatif(
        self, profile: str, speedup: str | None = None, drop_syncs: bool = False,
        chip: str | None = None, step: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        return await self.api.get(f"p/{self._name(profile)}/whatif", speedup=speedup,
                                  drop_syncs="true" if drop_syncs else None, chip=chip,
                                  step=step)  # fmt: skip

    async def report(self, profile: str, against: str | None = None) -> dict[str, Any]:
        import anyio

        from neuron_explorer.web.responses import clip_strings

        from .report import profile_report, render_markdown

        base = self.api.profile(against) if against else None

        def build() -> dict[str, Any]:
            name = self.api.profile(profile)
            service = self.api.app.state.service
            with contextlib.ExitStack() as held:  # each profile's analysis lock, in name order
                for n in sorted({name} | ({base} if base else set())):
                    service.admit(n)  # the bounds and the memory ceiling every route has
                    held.enter_context(self.api.store.profile_lock(n))
                return profile_report(
                    self.api.store.open(name), self.api.store.open(base) if base else None
                )

        doc = clip_strings(await anyio.to_thread.run_sync(build))
        return {"markdown": render_markdown(doc), "report": doc}


def make_tools(api: Api) -> dict[str, tuple[Tool, str]]:
    """Tool name -> (coroutine, description), in the order an agent uses them."""
    tools = ProfileTools(api)
    return {name: (getattr(tools, name), text) for name, text in DESCRIPTIONS.items()}


def describe(description: str) -> str:
    return description + UNITS + f" Answers are cut to about {MAX_CHARS:,} characters of JSON."


async def answer(tool: Tool, **kwargs: Any) -> dict[str, Any]:
    """The tool's answer, bounded; a Refused request becomes the error the agent reads."""
    try:
        return bound(await tool(**kwargs))
    except Refused:
        raise
    except ValueError as e:
        raise Refused(str(e)) from None
