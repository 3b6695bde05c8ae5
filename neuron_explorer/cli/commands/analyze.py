"""`neuron-explorer analyze PROFILE`: findings ranked by estimated saving."""

from __future__ import annotations

import argparse

from ...importers import DEFAULT_MEMORY_BUDGET  # light: the registry imports no numpy or Arrow
from .import_trace import memory_budget

NAME = "analyze"
HELP = (
    "Run the bottleneck rules on a profile and print the findings ranked by estimated saving "
    "(exit status 0 whatever is found)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", nargs="?", help="profile directory")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--rule", action="append", metavar="ID", help="run only this rule (repeatable)"
    )
    parser.add_argument(
        "--explain", metavar="ID", help="describe a rule (pattern, algorithm, thresholds, fix)"
    )
    parser.add_argument("--list", action="store_true", help="list the rules")
    parser.add_argument(
        "--store",
        action="store_true",
        help="compute again the analysis the import stores in the profile (the whole's, or an "
        "excerpt's when over --memory-budget), e.g. after an upgrade made it stale",
    )
    parser.add_argument(
        "--memory-budget",
        type=memory_budget,
        default=DEFAULT_MEMORY_BUDGET,
        metavar="SIZE",
        help="with --store: the analysis's memory, as the import's (default 2G)",
    )


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis import all_rules, get_rule, stored
    from ...analysis.runner import findings_report
    from ...errors import ExplorerError
    from ..scope import open_analysed

    if args.explain:
        rule = get_rule(args.explain)
        doc = {
            "id": rule.id, "title": rule.title, "severity": rule.severity, "scope": rule.scope,
            "doc": rule.doc(), "thresholds": rule.thresholds(), "fix": rule.fix,
        }  # fmt: skip
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            render_explain(doc)
        return 0
    if args.list:
        rules = [{"id": r.id, "title": r.title, "scope": r.scope} for r in all_rules().values()]
        if args.json:
            print(json.dumps(rules, indent=2))
        else:
            for r in sorted(rules, key=lambda r: r["id"]):
                print(f"{r['id']:<24} {r['scope']:<7} {r['title']}")
        return 0
    if not args.profile:
        raise ExplorerError("analyze: give a PROFILE directory (or --explain ID / --list)")
    if args.store:
        return _store(args.profile, args.memory_budget)
    profile = open_analysed(args.profile, args.json)
    # every rule: what the import stored, when it is current (the same document: stored.py)
    doc = (stored.load(profile, "findings_report") if args.rule is None else None) \
        or findings_report(profile, args.rule).to_dict()  # fmt: skip
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    render_findings(doc)
    return 0


def _store(path: str, budget: int | None) -> int:
    """`--store`: the import's stored analysis computed again, and one line saying what."""
    import sys

    from ...analysis.scoped import store_analysis
    from ...errors import ExplorerError
    from ...model.profile import Profile

    profile = Profile.open(path)
    try:
        line = store_analysis(profile, budget)
    except OSError as e:  # a read-only profile cannot hold an excerpt
        raise ExplorerError(f"{path}: cannot store its analysis ({e.strerror})") from None
    print(line or f"{path}: nothing stored (under 100,000 events, or a read-only folder)",
          file=sys.stderr)  # fmt: skip
    return 0


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.2f} ms"


def render_explain(doc: dict) -> None:
    from rich.console import Console

    c = Console()
    c.print(
        f"[bold]{doc['id']}[/]: {doc['title']}  (scope {doc['scope']}, "
        f"severity at least {doc['severity']})"
    )
    c.print(doc["doc"], highlight=False)
    c.print("[bold]Thresholds[/]")
    for k, v in doc["thresholds"].items():
        c.print(f"  {k} = {v}", highlight=False)
    c.print(f"[bold]Fix[/]: {doc['fix']}", highlight=False)


def _ending_lines(ending: dict | None) -> list[str]:
    """The job-ending document's sentences (analysis.job.JobEnding)."""
    from ...analysis.job import JobEnding, RankEnding

    if not ending:
        return []
    ended = tuple(RankEnding(**e) for e in ending["ended"])
    return JobEnding(ended, tuple(ending["missing_ranks"])).lines()


def render_findings(doc: dict) -> None:
    from rich.console import Console
    from rich.markup import escape

    from .summary import run_ended_line

    c = Console()
    findings = doc["findings"]
    c.print(
        f"[bold]{doc['profile']}[/]: {len(findings)} finding(s) from "
        f"{len(doc['rules_run'])} rules over {_ms(doc['total_step_ns'])} of steps"
    )
    ending = doc.get("job_ending") or {}
    one_run = len(ending.get("ended", ())) == 1 and not ending.get("missing_ranks")
    if doc.get("run_ended") and (one_run or not ending):  # one process's run, as summary says it
        c.print(f"[bold red]{escape(run_ended_line(doc['run_ended']))}[/]", highlight=False)
    else:
        for text in _ending_lines(ending or None):
            c.print(f"[bold red]{escape(text)}[/]", highlight=False)
    for i, f in enumerate(findings, 1):
        _render_finding(c, i, f)
    if not findings:
        c.print("No problems found by the rules that ran.")
    elif doc.get("replayed_total_ns") is not None:
        n = sum(1 for f in findings if f.get("replayed"))
        c.print()
        c.print(
            f"[bold]All {n} replayed change(s) together save ~{_ms(doc['replayed_total_ns'])} "
            f"({100 * doc['replayed_total_share']:.1f}% of step time)[/]: one replay of every "
            "change above at once; the findings' own savings do not add where they overlap.",
            highlight=False,
        )


def _render_finding(c, i: int, f: dict) -> None:
    """One finding: its title, saving, detail, evidence table and fix."""
    from rich.markup import escape
    from rich.table import Table

    from .lines import _short

    colour = {"high": "red", "medium": "yellow", "low": "cyan"}
    sev = f"[{colour.get(f['severity'], 'white')}]{f['severity'].upper()}[/]"
    c.print()
    tag = " [magenta]READINESS[/]" if f.get("category") == "readiness" else ""
    c.print(
        f"{i}. {sev}{tag} [bold]{escape(f['title'])}[/]  [dim]({f['rule']})[/]", highlight=False
    )
    c.print(
        f"   saves {'at most ' if f.get('bound') else ''}~{_ms(f['saving_ns'])} "
        f"({100 * f['saving_share']:.1f}% of step time)"
        + (f", replayed: {escape(f['replayed'])}" if f.get("replayed") else "")
        + (f" (an upper bound: {escape(f['bound'])})" if f.get("bound") else ""),
        highlight=False,
    )
    if f.get("overlaps"):  # their changes replayed together save less than the sum
        c.print(f"   [bold]overlaps {', '.join(f['overlaps'])}: the savings do not add[/]",
                highlight=False)  # fmt: skip
    c.print(f"   {escape(f['detail'])}", highlight=False)
    ev = f["evidence"]
    rows = [("op", h) for h in ev["ops"]] + [("line", h) for h in ev["source_lines"]]
    rows += [("model line", {**h, "label": _short(h["label"])})
             for h in ev.get("model_lines", ())[:3]]  # fmt: skip
    rows += [("module", h) for h in ev.get("modules", ())[:3]]
    if rows:
        t = Table(show_header=True, box=None, padding=(0, 1), pad_edge=False)
        for h in ("", "evidence", "time", "count", "note"):
            t.add_column(h, overflow="fold")
        for what, h in rows[:10]:
            t.add_row("   " + what, h["label"][:100], _ms(h["dur_ns"]), str(h["count"]), h["note"])
        c.print(t)
    c.print(f"   [green]fix:[/] {escape(f['fix'])}", highlight=False)
