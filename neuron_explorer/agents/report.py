"""`neuron-explorer report`: a profile's findings, readiness block, top lines and modules and
(against a baseline) the before/after deltas, as one JSON document and as Markdown to paste
into a pull request. Every part is the document the CLI and the web already produce (analyze
--json, summary --json, the source and compare views); this module only picks and renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_explorer.model import Profile

TOP_LINES = 10
TOP_DELTAS = 10
LINES_PER_FINDING = 5


def _tables(profile: Profile) -> tuple[Any, Any]:
    """The operator and source-line tables of `profile` (analysis, as the web's pages)."""
    from neuron_explorer.analysis.context import context
    from neuron_explorer.analysis.lines import line_table
    from neuron_explorer.analysis.operators import operator_table

    cols = context(profile).cols
    return operator_table(cols), line_table(cols)


def _where_in_model(profile: Profile, n: int) -> dict[str, list[dict[str, Any]]]:
    """The top nn.Modules and model lines, as `summary --json` gives them (analysis/hotspots)."""
    from neuron_explorer.analysis.hotspots import top_lines, top_modules

    con = profile.duckdb()
    try:
        return {"top_modules": top_modules(profile, n, con),
                "top_model_lines": top_lines(profile, "model", n, con)}  # fmt: skip
    finally:
        con.close()


def profile_report(profile: Profile, base: Profile | None = None) -> dict[str, Any]:
    """The report document of `profile`, with deltas from `base` (the run before) if given."""
    from neuron_explorer.analysis import compare, findings_document, run_rules, summarize
    from neuron_explorer.analysis.page import is_modeled
    from neuron_explorer.analysis.steps import job_steps, profile_steps
    from neuron_explorer.web.views import source  # the web's file ids on the lines

    summary = summarize(profile).to_dict()
    ops, lines = _tables(profile)
    doc: dict[str, Any] = {
        "profile": str(profile.path),
        "name": profile.path.name,
        "source": profile.manifest.source,
        "device_time_modeled": is_modeled(profile),
        "step_stats": summary["step_stats"],
        "breakdown": summary["breakdown"],
        "readiness": summary.get("readiness"),
        "findings": findings_document(profile, run_rules(profile))["findings"],
        "top_lines": source.top_lines(lines, TOP_LINES),
        **_where_in_model(profile, TOP_LINES),
        "against": None,
    }
    if base is not None:
        before = summarize(base).to_dict()
        base_ops, base_lines = _tables(base)
        stats = [profile_steps(p) for p in (base, profile)]
        sa, sb = (None if st is None else st.to_dict() for st in stats)
        ja, jb = (job_steps(st) for st in stats)
        found_before = {f["rule"] for f in findings_document(base, run_rules(base))["findings"]}
        found_now = {f["rule"] for f in doc["findings"]}
        doc["against"] = {
            "profile": str(base.path),
            "name": base.path.name,
            "steps": {"before": sa, "after": sb},
            # medians of each step's slowest rank, as diff and its gate give them
            "job_steps": {"before": ja.to_dict() if ja else None,
                          "after": jb.to_dict() if jb else None},
            "step_ns_delta": round(jb.median_ns - ja.median_ns) if ja and jb else None,
            "breakdown": compare.compare_breakdown(before, summary, ja, jb),
            "ops": compare.compare_ops(base_ops, ops)[:TOP_DELTAS],
            "lines": compare.compare_lines(base_lines, lines)[:TOP_DELTAS],
            "findings_new": sorted(found_now - found_before),
            "findings_gone": sorted(found_before - found_now),
        }  # fmt: skip
    return doc


# ---- Markdown ------------------------------------------------------------------------------
def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.3f} ms"


def _delta_ms(ns: float | None) -> str:
    return "-" if ns is None else f"{'+' if ns > 0 else ''}{ns / 1e6:,.3f} ms"


def _cell(text: Any) -> str:
    """A table cell: pipes escaped, on one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _where(file: str | None, line: int | None) -> str:
    return f"`{Path(file).name}:{line}`" if file and line else "-"


def _places(evidence: dict[str, Any], key: str) -> list[tuple[Any, Any]]:
    return [(h.get("file"), h.get("line")) for h in evidence.get(key) or []]


def _finding_md(i: int, f: dict[str, Any]) -> list[str]:
    at_most = "at most " if f.get("bound") else ""
    lines = [f"{i}. **{_cell(f['title'])}** (`{f['rule']}`, {f['severity']}, saves {at_most}~"
             f"{_ms(f['saving_ns'])}, {100 * f['saving_share']:.1f}% of step time)"]  # fmt: skip
    if f.get("replayed"):
        lines.append(f"   - saving replayed: {_cell(f['replayed'])}")
    elif f.get("bound"):
        lines.append(f"   - an upper bound: {_cell(f['bound'])}")
    ev = f["evidence"]
    for key, label in (("source_lines", "lines"), ("model_lines", "model lines")):
        shown = ", ".join(f"`{h['file']}:{h['line']}` ({_ms(h['dur_ns'])}, {h['count']}x)"
                          for h in (ev.get(key) or [])[:LINES_PER_FINDING] if h.get("file"))  # fmt: skip
        if shown and (key == "source_lines" or _places(ev, key) != _places(ev, "source_lines")):
            lines.append(f"   - {label}: {shown}")
    modules = ", ".join(
        f"`{_cell(m['label'])}`" for m in (ev.get("modules") or [])[:LINES_PER_FINDING]
    )
    if modules:  # where in the model (nn.Module paths), when the profile records them
        lines.append(f"   - modules: {modules}")
    lines.append(f"   - fix: {_cell(f['fix'])}")
    return lines


def _readiness_md(r: dict[str, Any] | None) -> list[str]:
    if not r:
        return []
    out = ["## Readiness", ""]
    for key, label in (("fallback_ops", "CPU fallbacks"), ("downcasts", "float64 downcasts"),
                       ("recompiles", "Recompiles")):  # fmt: skip
        rows = r.get(key) or []
        items = "; ".join(f"`{x.get('op')}` at {_where(x.get('file'), x.get('line'))} "
                          f"({x.get('calls', '?')} calls)" for x in rows)  # fmt: skip
        out.append(f"- {label}: {items or 'none'}")
    syncs = r.get("syncs") or []
    items = "; ".join(f"`{s['what']}` at {_where(s.get('file'), s.get('line'))} ({s['calls']} "
                      f"calls in {s['steps']} steps, wait {_ms(s['wait_ns'])})" for s in syncs)  # fmt: skip
    out.append(f"- Host syncs in the step: {items or 'none'}")
    out.append(f"- Compile {_ms(r.get('compile_ns'))}; first step {_ms(r.get('first_step_ns'))}, "
               f"steady step {_ms(r.get('steady_step_ns'))}")  # fmt: skip
    return [*out, ""]


def _breakdown_md(b: dict[str, Any], steps_ns: float | None) -> list[str]:
    """The step-time split: the summary's labelled parts where it has them, else its fields."""
    parts = b.get("parts")
    if isinstance(parts, list):
        rows = [(p["label"], p["ns"]) for p in parts]
    else:
        rows = [(k.removesuffix("_ns").replace("_", " "), v) for k, v in b.items()
                if isinstance(v, (int, float)) and k != "steps_ns"]  # fmt: skip
    if not rows:
        return []
    whole = steps_ns or b.get("steps_ns")
    out = ["## Where the step time goes", "", f"All steps: {_ms(whole)}.", "",
           "| part | time | share |", "|---|---:|---:|"]  # fmt: skip
    for label, ns in rows:
        share = f"{100 * ns / whole:.1f}%" if whole and isinstance(ns, (int, float)) else "-"
        out.append(f"| {_cell(label)} | {_ms(ns)} | {share} |")
    return [*out, ""]


def _against_md(a: dict[str, Any]) -> list[str]:
    before, after = a["job_steps"]["before"], a["job_steps"]["after"]
    out = [f"## Against `{a['name']}`", "",
           f"Median step {_ms((before or {}).get('median_ns'))} -> {_ms((after or {}).get('median_ns'))} "
           f"({_delta_ms(a['step_ns_delta'])}).", ""]  # fmt: skip
    if a["findings_new"] or a["findings_gone"]:
        out += [f"Findings new: {', '.join(f'`{x}`' for x in a['findings_new']) or 'none'}; "
                f"gone: {', '.join(f'`{x}`' for x in a['findings_gone']) or 'none'}.", ""]  # fmt: skip
    if a["breakdown"]:
        out += ["| per step | before | after | delta |", "|---|---:|---:|---:|"]
        out += [f"| {r['category'].removesuffix('_ns').replace('_', ' ')} | {_ms(r['a'])} | {_ms(r['b'])} | {_delta_ms(r['delta'])} |"
                for r in a["breakdown"] if r["category"] != "steps_ns"]  # fmt: skip
        out.append("")
    for key, title, label in (("ops", "Ops", lambda r: f"`{_cell(r['name'])}`"),
                              ("lines", "Lines", lambda r: _where(r["file"], r["line"]))):  # fmt: skip
        if a[key]:
            out += [
                f"| {title} (largest change) | before | after | delta |",
                "|---|---:|---:|---:|",
            ]
            out += [f"| {label(r)} | {_ms(r['a'].get('time_ns'))} | {_ms(r['b'].get('time_ns'))} "
                    f"| {_delta_ms(r['delta'])} |" for r in a[key]]  # fmt: skip
            out.append("")
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    """The report as GitHub-flavoured Markdown."""
    st = doc["step_stats"] or {}
    out = [f"# Neuron Explorer report: `{doc['name']}`", ""]
    out.append(f"Source {doc['source']}; {st.get('count', 0)} steps, mean "
               f"{_ms(st.get('mean_ns'))}, min {_ms(st.get('min_ns'))}, max {_ms(st.get('max_ns'))}.")  # fmt: skip
    if doc["device_time_modeled"]:
        out.append("Device times come from the Trainium cost model, not from a measurement.")
    out.append("")
    groups = (("readiness", "Porting problems"), ("performance", "Performance findings"))
    for category, title in groups:
        found = [f for f in doc["findings"] if f.get("category", "performance") == category]
        if found:
            out += [f"## {title}", ""]
            for i, f in enumerate(found, 1):
                out += _finding_md(i, f)
            out.append("")
    if not doc["findings"]:
        out += ["No problems found by the rules.", ""]
    out += _readiness_md(doc["readiness"])
    out += _breakdown_md(doc["breakdown"] or {}, st.get("total_ns"))
    if doc["top_lines"]:
        out += ["## Top lines", "", "| line | function | host | device | ops |",
                "|---|---|---:|---:|---:|"]  # fmt: skip
        out += [f"| `{_cell(r['file'])}:{r['line']}` | {_cell(r['func'])} | {_ms(r['host_ns'])} | "
                f"{_ms(r['device_ns'])} | {r['ops']} |" for r in doc["top_lines"]]  # fmt: skip
        out.append("")
    if doc["top_modules"]:
        out += ["## Top modules (device self time)", "", "| module | self | total | calls |",
                "|---|---:|---:|---:|"]  # fmt: skip
        out += [f"| `{_cell(m['label'])}` | {_ms(m['self_ns'])} | {_ms(m['total_ns'])} "
                f"| {m['calls']} |" for m in doc["top_modules"]]  # fmt: skip
        out.append("")
    if doc["top_model_lines"]:
        out += ["## Top model lines (device self time)", "", "| line | function | self | total |",
                "|---|---|---:|---:|"]  # fmt: skip
        out += [f"| `{_cell(r['file'])}:{r['line']}` | {_cell(r['func'])} | {_ms(r['self_ns'])} | "
                f"{_ms(r['total_ns'])} |" for r in doc["top_model_lines"]]  # fmt: skip
        out.append("")
    if doc["against"]:
        out += _against_md(doc["against"])
    return "\n".join(out).rstrip() + "\n"
