"""`neuron-explorer diff A B`: profile B against profile A (analysis/compare.py)."""

from __future__ import annotations

import argparse

NAME = "diff"
HELP = (
    "Compare profile B against profile A: step time, the per-step breakdown, and ops, kernels, "
    "source lines and modules by the change in their time (largest first), and the findings "
    "that appeared or went. --json prints the document of the web's /api/compare. Two ranks "
    "of one job side by side: diff JOB@rank=0 JOB@rank=1. --gate PCT: a regression verdict for "
    "CI (exit 1 when B's median step is slower than A's by more than the gate, with "
    "confidence from the steps' spread)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="profile directory A (before); DIR@rank=N: one rank of a job")
    parser.add_argument("b", help="profile directory B (after); DIR@rank=N: one rank of a job")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--top", type=int, default=10, help="rows per table (10)")
    parser.add_argument("--gate", default=None, metavar="PCT",
                        help="exit 1 when B regressed past PCT (e.g. 5%%) with confidence")  # fmt: skip
    parser.add_argument("--metric", default="step",
                        help="what the gate judges per step: step (default), op=NAME, kernel=NAME")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis.compare import diff
    from ...analysis.rank_compare import open_side
    from ...errors import ExplorerError

    if args.top < 1:
        raise ExplorerError("diff: --top must be at least 1")
    (a, a_name), (b, b_name) = open_side(args.a), open_side(args.b)  # DIR or DIR@rank=N
    gate = None
    if args.gate is not None:
        from ...analysis.gate import parse_gate, verdict

        gate = verdict(a, b, parse_gate(args.gate), args.metric)
    doc = diff(a, b, a_name, b_name)
    if args.json:
        out = doc.to_dict() if gate is None else {"gate": gate.to_dict(), **doc.to_dict()}
        print(json.dumps(out, indent=2, default=str))
    else:
        if gate is not None:
            print(f"gate: {gate.verdict.upper()}: {gate.reason}")
        render_comparison(doc, args.top if gate is None else min(args.top, 5))
    return 1 if gate is not None and gate.verdict == "regression" else 0


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.3f} ms"


def _delta(ns: float) -> str:
    return f"{'+' if ns > 0 else ''}{ns / 1e6:,.3f} ms"


def _steps(j) -> str:  # analysis.steps.JobSteps
    if j is None:
        return "0 steps"
    text = f"{j.count} whole step{'s' if j.count != 1 else ''}"
    if j.ranks > 1:
        text += f", each its slowest of {j.ranks} ranks"
    return text


def _pct(r: dict) -> str:
    return "new" if r["ratio"] is None else f"{100 * (r['ratio'] - 1):+.1f}%"


def render_comparison(doc, top: int = 10) -> None:  # analysis.compare.Comparison
    from rich.console import Console
    from rich.markup import escape

    from ..tables import fit_table, wrap_parts
    from .lines import _short

    c = Console()
    c.print(wrap_parts(c.width, [f"A {escape(doc.a)}", f"B {escape(doc.b)}"], "  ->  "),
            highlight=False, soft_wrap=True)  # fmt: skip
    ja, jb = doc.job_steps["a"], doc.job_steps["b"]
    parts = [f"median step A {_ms(ja.median_ns if ja else None)} ({_steps(ja)})",
             f"B {_ms(jb.median_ns if jb else None)} ({_steps(jb)})"]  # fmt: skip
    if doc.step_ns_delta is not None:
        parts.append(f"change {_delta(doc.step_ns_delta)}")
    c.print(wrap_parts(c.width, parts), highlight=False)
    if max(ja.ranks if ja else 1, jb.ranks if jb else 1) > 1:
        c.print("a step of several ranks is as long as its slowest rank: the median is over "
                "steps, as the gate's", highlight=False)  # fmt: skip
    if doc.device_time_modeled:
        c.print("device times come from the cost model", highlight=False)
    if doc.breakdown:
        rows = [(r["label"], _ms(r["a"]), _ms(r["b"]), _delta(r["delta"]))
                for r in doc.breakdown if r["a"] or r["b"]]  # fmt: skip
        c.print(
            fit_table(
                c.width,
                ("part of the step", "A", "B", "change"),
                rows,
                title="The median step",
                right=(1, 2, 3),
            )
        )
    tables = (
        ("Ops (host self + device time)", "op", doc.ops, lambda r: r["name"]),
        ("Kernels (device time)", "kernel", doc.kernels, lambda r: r["name"]),
        ("Source lines (host + device time)", "line", doc.lines,
         lambda r: f"{_short(r['file'])}:{r['line']}"),
        ("Modules (device self time)", "module", doc.modules, lambda r: r["path"] or "(model)"),
    )  # fmt: skip
    for title, what, rows, label in tables:
        shown = [r for r in rows if r["delta"]][:top]
        if not shown:
            continue
        value = "self_ns" if what == "module" else "time_ns"
        changes = [(escape(label(r)), _ms(r["a"].get(value)), _ms(r["b"].get(value)),
                    _delta(r["delta"]), _pct(r)) for r in shown]  # fmt: skip
        heads = (what, "A", "B", "change", "%")
        c.print(fit_table(c.width, heads, changes, title=f"{title}, largest change first",
                          right=(1, 2, 3, 4)))  # fmt: skip
    _render_findings(c, doc.findings)


def _render_findings(c, f) -> None:  # analysis.compare.FindingsDiff
    from rich.markup import escape

    if not f.available:
        return
    for title, found in (("Findings that appeared in B", f.appeared),
                         ("Findings that went (in A only)", f.went)):  # fmt: skip
        c.print(f"[bold]{title}[/]: {len(found) or 'none'}")
        for x in found:
            c.print(f"  {x['severity']}: {escape(x['title'])} ({x['rule']})", highlight=False)
    if f.both:
        c.print(f"[bold]In both[/]: {', '.join(x['rule'] for x in f.both)}", highlight=False)
