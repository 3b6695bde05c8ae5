"""`neuron-explorer mcp PATH`: a Model Context Protocol server over stdio serving the profiles
under PATH, with the tools of tools.py and the profile schema as a resource."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .api import Api, Refused
from .tools import answer, describe, make_tools

SCHEMA_URI = "neuron-explorer://schema"
INSTRUCTIONS = (
    "Neuron Explorer profiles of PyTorch runs (captured on the modeled Trainium neuron device, "
    "or imported torch.profiler traces). To find why a step is slow and which line to change: "
    "list_profiles; summary (where step time goes); findings (ranked problems with evidence "
    "lines and fixes; readiness findings are porting problems, fix those first); source_line "
    "for a finding's line; event for an event id; hotspots and operators for the heaviest "
    "lines and ops; timeline for a time window; sql for anything else (schema: resource "
    f"{SCHEMA_URI}); compare for before/after; report for a Markdown summary. "
    "Times are integer ns."
)


WALKTHROUGH = """Find why the steps of the profile {profile!r} are slow and which line to change.
1. summary: where the step time goes (summary.breakdown.parts add up to the steps) and, on the
   neuron device, the readiness block (CPU fallbacks, float64 downcasts, recompiles, host syncs).
2. findings with category "readiness": porting problems; fix these first. Then the performance
   findings, ranked by saving_ns, each with evidence.source_lines and a fix.
3. source_line for the lines of the top findings: the code and its host and device time; event
   for an evidence event id: its stack, module and the device work it launched.
4. hotspots and operators if the rules found nothing big: the heaviest lines, modules and ops.
5. Answer with the line(s) to change, the change, and the time it should save (ns or ms); say
   when device times are modeled (device_time_modeled)."""


def schema_document() -> dict[str, Any]:
    """The profile format as `neuron-explorer schema --json` prints it (the same data)."""
    from neuron_explorer.model.schema import OPTIONAL_TABLES, SCHEMA_VERSION, TABLES

    return {
        "schema_version": SCHEMA_VERSION,
        "tables": {
            t.name: {"doc": t.doc, "optional": t.name in OPTIONAL_TABLES, "columns": [
                {"name": c.name, "type": str(c.type), "unit": c.unit, "doc": c.doc}
                for c in t.columns]}
            for t in (*TABLES.values(), *OPTIONAL_TABLES.values())
        },
    }  # fmt: skip


def _as_tool(fn: Any) -> Any:
    """`fn` as the SDK registers it: same parameters, answering a bounded CallToolResult whose
    text is compact JSON (the agent's context pays for every character)."""
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent

    @functools.wraps(fn)
    async def tool(**kwargs: Any) -> CallToolResult:
        try:
            doc = await answer(fn, **kwargs)
        except Refused as e:
            raise ToolError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - a bug or an unreadable table: one failed call, in a line
            line = (str(e).strip().splitlines() or [""])[0][:500]
            raise ToolError(f"{type(e).__name__}: {line}") from None
        text = json.dumps(doc, separators=(",", ":"), default=str)
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=doc)

    del tool.__wrapped__  # the SDK reads the signature below, not the wrapped function's
    sig = inspect.signature(fn, eval_str=True)
    tool.__signature__ = sig.replace(return_annotation=CallToolResult)  # type: ignore[attr-defined]
    tool.__annotations__ = {**{k: v.annotation for k, v in sig.parameters.items()},
                            "return": CallToolResult}  # fmt: skip
    return tool


def build_server(root: str | Path, analysis_cache: str | Path | None = None):  # MCPServer
    """The MCP server over the profiles under `root` (a resolved profile or folder of them)."""
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    from neuron_explorer import __version__

    api = Api(root, analysis_cache=analysis_cache)
    server = MCPServer("neuron-explorer", version=__version__, instructions=INSTRUCTIONS,
                       log_level="WARNING")  # fmt: skip
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
    for name, (fn, text) in make_tools(api).items():
        server.add_tool(_as_tool(fn), name=name, description=describe(text), annotations=read_only)

    @server.resource(SCHEMA_URI, name="schema", mime_type="application/json",
                     description="Every table and column of a profile with its type, unit and meaning.")  # fmt: skip
    def schema() -> str:
        return json.dumps(schema_document(), indent=1)

    @server.prompt(name="why_is_this_step_slow", title="Why is this step slow?",
                   description="Find where a profile's step time goes and which line to change.")  # fmt: skip
    def why_is_this_step_slow(profile: str) -> str:
        return WALKTHROUGH.format(profile=profile)

    return server


def serve_stdio(path: str | Path, source_roots: Sequence[Path] = ()) -> int:
    """Serve PATH (a profile, a folder of profiles or raw traces, keeping their sources from
    their own folder and `source_roots` only) over stdio until the client closes the
    connection."""
    import contextlib
    import sys

    from neuron_explorer.web import resolve_root

    with contextlib.redirect_stdout(sys.stderr):  # stdout is the protocol's wire: keep it clean
        server = build_server(resolve_root(path, source_roots))
    server.run("stdio")
    return 0
