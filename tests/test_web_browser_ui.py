"""The layout and the links of the pages, in a real Chromium against a real uvicorn (issue 30):
the Modules icicle inside its panel, no CSS text transform on names, a 400-character templated
kernel name on one line in every table and the lane column widened by dragging, the memory
held at the peak by line never more than the peak, and a module named anywhere leading to it on
the Modules page and from there to its events on the timeline. Screenshots at 1600x1000 go to
screenshots/ui-*.png (git-ignored), to be checked by eye."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ROOT, SAMPLE_TRACE, uvicorn_server
from test_web_browser import ARGS, CHROMIUM, SHOTS

pytestmark = pytest.mark.browser
# a templated C++ kernel name of 400 characters, as CUTLASS and Triton produce
LONG = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int>, "
        + "cutlass::epilogue::collective::Sm90EpilogueTmaWarpSpecialized<float>, " * 5)  # fmt: skip
LONG = (LONG + "x" * 400)[:399] + ">"


def long_name_trace(path: Path) -> Path:
    """A Kineto trace: one step, an op that launches the 400-character kernel, on a thread
    whose name is long too."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 2000, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1010, "dur": 300, "args": {"External id": 5}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1020, "dur": 10,
         "args": {"correlation": 7, "External id": 5}},
        {"ph": "X", "cat": "kernel", "name": LONG, "pid": 0, "tid": 7, "ts": 1100, "dur": 500,
         "args": {"correlation": 7, "device": 0, "stream": 7, "External id": 5}},
    ]  # fmt: skip
    path.write_text(
        json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000 * 10**9})
    )
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from neuron_explorer.importers import import_traces
    from neuron_explorer.web.app import create_app

    tmp = tmp_path_factory.mktemp("webui-layout")
    root = tmp / "profiles"
    root.mkdir()
    shutil.copytree(ROOT / "samples" / "profiles" / "gpt_train", root / "gpt")
    import_traces([SAMPLE_TRACE], root / "cpu_mlp", source_roots=[ROOT / "samples"])
    import_traces([long_name_trace(tmp / "long.json")], root / "long")
    app = create_app(root, analysis_cache=tmp / "cache")
    with uvicorn_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def context():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (make browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = b.new_context(viewport={"width": 1600, "height": 1000})
        yield ctx
        ctx.close()
        b.close()


@pytest.fixture
def page(context):
    pg = context.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    assert pg.errors == [], pg.errors
    pg.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"ui-{name}.png"), full_page=True)


def inside(inner: dict, outer: dict) -> bool:
    return (outer["x"] - 1 <= inner["x"] and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 1
            and outer["y"] - 1 <= inner["y"] and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 1)  # fmt: skip


def one_line(cell) -> bool:
    line = float(cell.evaluate("e => parseFloat(getComputedStyle(e).lineHeight) || 16"))
    return cell.bounding_box()["height"] < 1.8 * line


def test_the_module_icicle_is_inside_its_panel(server, page):
    page.goto(server + "/p/gpt/modules")
    page.wait_for_selector("#module-icicle .main-svg")
    svg = page.locator("#module-icicle .main-svg").first.bounding_box()
    panel = page.locator("section.panel", has=page.locator("#module-icicle")).bounding_box()
    table = page.locator("#module-table").bounding_box()
    shot(page, "modules")
    assert inside(svg, panel), (svg, panel)
    assert svg["y"] + svg["height"] <= table["y"]  # not drawn over its own table


def test_no_name_is_transformed_by_css(server, page):
    """Names are shown as written: no uppercase (or any) transform on panel titles, cards or
    chips, where an event's or a profile's name goes."""
    page.goto(server + "/p/long/timeline")
    page.wait_for_selector("#tl-canvas[data-ready]")
    transforms = page.evaluate(
        """() => [...document.styleSheets].flatMap((s) => [...s.cssRules])
            .filter((r) => r.style && r.style.textTransform && r.style.textTransform !== 'none')
            .map((r) => r.selectorText)"""
    )
    assert transforms == []
    page.goto(server + "/p/gpt")
    page.wait_for_selector(".panel h2")
    for sel in [".panel h2", ".card-label"]:
        for el in page.locator(sel).all():
            assert el.evaluate("e => getComputedStyle(e).textTransform") == "none"


def test_a_400_character_kernel_name_stays_on_one_line(server, page):
    assert len(LONG) == 400
    # SQL
    page.goto(
        server
        + "/p/long/sql?q="
        + "SELECT%20name,%20dur_ns%20FROM%20events%20WHERE%20kind%20%3D%20'gpu_kernel'"
    )
    cell = page.locator("#sql-result td", has_text=LONG[:40]).first
    cell.wait_for()
    shot(page, "sql-long-name")
    assert one_line(cell) and cell.get_attribute("title") == LONG
    assert inside(cell.bounding_box(), page.locator("#sql-result").bounding_box())
    # the expanded operator row
    page.goto(server + "/p/long/operators")
    page.locator("#app table.data tbody tr", has_text="aten::mm").first.click()
    cell = page.locator(".detail-row table.data td", has_text=LONG[:40]).first
    cell.wait_for()
    shot(page, "operators-long-name")
    assert one_line(cell) and cell.get_attribute("title") == LONG
    # the kernels page-wide tables (summary's top kernels)
    page.goto(server + "/p/long")
    page.wait_for_selector("table.data td")
    for c in page.locator("table.data td", has_text=LONG[:40]).all():
        assert one_line(c)


def test_the_lane_label_column_widens_by_dragging(server, page):
    page.goto(server + "/p/long/timeline")
    page.evaluate("localStorage.removeItem('ne.tl.gutter')")
    page.reload()
    page.wait_for_selector("#tl-canvas[data-ready]")
    handle = page.locator("#tl-gutter-handle")
    before = handle.bounding_box()
    page.mouse.move(before["x"] + 3, before["y"] + 40)
    page.mouse.down()
    page.mouse.move(before["x"] + 203, before["y"] + 40, steps=5)
    page.mouse.up()
    after = handle.bounding_box()
    shot(page, "timeline-wide-labels")
    assert after["x"] - before["x"] == pytest.approx(200, abs=4)
    page.reload()  # kept for the next visit
    page.wait_for_selector("#tl-canvas[data-ready]")
    assert page.locator("#tl-gutter-handle").bounding_box()["x"] == pytest.approx(after["x"], abs=2)
    page.evaluate("localStorage.removeItem('ne.tl.gutter')")


@pytest.mark.parametrize("name", ["cpu_mlp", "gpt"])
def test_memory_by_line_sums_to_at_most_the_peak(server, page, name):
    page.goto(f"{server}/p/{name}/memory")
    page.wait_for_selector("#memory-chart .main-svg")
    shot(page, f"memory-{name}")
    d = page.evaluate(f"fetch('/api/p/{name}/memory').then((r) => r.json())")
    pk = d["peak"]
    assert sum(r["held_bytes"] for r in pk["by_line"]) <= pk["value"]
    for r in pk["by_line"]:
        assert r["held_bytes"] <= r["allocated_bytes"] + 1e-6
    assert page.locator("a.mem-line").count() == len(pk["by_line"])


def test_a_module_link_lands_at_the_module_and_its_events(server, page):
    """From a kernel's details on the timeline to its module on the Modules page (scrolled to,
    marked), and from there to the module's events outlined on the timeline."""
    # a finding's module evidence deep-links to the module
    page.goto(server + "/p/gpt/findings")
    page.wait_for_selector(".finding")
    assert page.locator("a.finding-module").count() > 0
    for a in page.locator("a.finding-module").all():
        label = a.inner_text()
        assert a.get_attribute("href") == "/p/gpt/modules?module=" + (
            "" if label == "(model)" else quote(label, safe="")
        )
    page.goto(server + "/p/gpt/modules?module=blocks.1.attn")
    row = page.wait_for_selector("#module-table tr.chosen")
    assert "blocks.1.attn" in row.inner_text()
    assert page.evaluate(
        "() => { const r = document.querySelector('#module-table tr.chosen').getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight; }"
    )
    shot(page, "modules-chosen")
    # a module clicked in the icicle is chosen the same way, and Back returns
    mods = page.evaluate("fetch('/api/p/gpt/modules').then((r) => r.json())")["modules"]
    k = next(i for i, m in enumerate(mods) if m["path"] == "blocks.0")
    page.evaluate(
        "k => document.getElementById('module-icicle').emit('plotly_icicleclick', {points: [{id: String(k)}]})",
        k,
    )
    page.wait_for_function(
        "() => document.querySelector('#module-chosen b') && document.querySelector('#module-chosen b').textContent === 'blocks.0'"
    )
    assert page.url.endswith("/p/gpt/modules?module=blocks.0")
    assert page.locator("#module-table tr.chosen").inner_text().startswith("blocks.0")
    page.go_back()
    page.wait_for_function(
        "() => document.querySelector('#module-chosen b') && document.querySelector('#module-chosen b').textContent === 'blocks.1.attn'"
    )
    with page.expect_navigation():
        page.click("#module-timeline")
    page.wait_for_selector("#tl-canvas[data-ready]")
    count = page.wait_for_selector("#tl-find-count[data-total]")
    total = int(count.get_attribute("data-total"))
    want = page.evaluate(
        "fetch('/api/p/gpt/modules/events?module=blocks.1.attn').then((r) => r.json())"
    )
    assert total == want["total"] > 0 and "module blocks.1.attn" in count.inner_text()
    assert all(m["id"] for m in want["matches"])
    # a selected event's module is a link, and it lands on that module
    sel = page.wait_for_function("() => window.neTimeline.state.selected !== null")
    assert sel
    link = page.wait_for_selector("a.event-module")
    path = link.inner_text()
    shot(page, "timeline-module-events")
    link.click()
    page.wait_for_selector("#module-table tr.chosen")
    assert page.locator("#module-chosen b").inner_text() == path


def test_compare_reads_medians_and_labels_each_part(server, page):
    """Compare: the cards are median steps and say what the median left aside, and the
    breakdown rows are labelled parts of the median step (no raw column name, no "host, other"
    row equal to the whole step) that add up to it."""
    page.goto(server + "/compare?a=cpu_mlp&b=gpt")
    page.wait_for_selector("#compare-chart .main-svg")
    shot(page, "compare")
    d = page.evaluate("fetch('/api/compare?a=cpu_mlp&b=gpt').then((r) => r.json())")
    sb, ja, jb = d["steps"]["b"], d["job_steps"]["a"], d["job_steps"]["b"]  # diff's, the gate's
    assert d["step_ns_delta"] == round(jb["median_ns"] - ja["median_ns"])
    assert "median of" in page.locator("#cmp-card-b .card-note").inner_text()
    cells = [
        c.inner_text()
        for c in page.locator("section.panel", has_text="The median step")
        .locator("tbody td:first-child")
        .all()
    ]
    assert cells and not any(c.endswith("_ns") or c == "host, other" for c in cells), cells
    steps = {r["step"]: r["dur_ns"] for r in sb["per_step"]}
    assert sum(r["b"] for r in d["breakdown"]) in steps.values()  # the parts of one real step


def test_the_flame_graph_is_linked_to_the_call_tree_and_coloured(server, page):
    """A frame clicked in the flame graph opens and marks its row in the call tree, at once (no
    zoom animation: the focus is set in the same turn); a row clicked focuses the flame graph;
    colour by library gives torch's frames one colour and the script's another."""
    page.goto(server + "/p/gpt/calltree")
    page.wait_for_selector("#flame .main-svg")
    d = page.evaluate("fetch('/api/p/gpt/calltree').then((r) => r.json())")
    deep = max((n for n in d["nodes"] if n["kind"] == "op" and n["total_ns"] > 0.02 * d["total_ns"]),
               key=lambda n: n["depth"])  # fmt: skip
    page.evaluate(
        "id => document.getElementById('flame').emit('plotly_icicleclick', {points: [{id: String(id)}]})",
        deep["id"],
    )
    row = page.wait_for_selector(
        f'#calltree-table tr.current[data-node="{deep["id"]}"]', timeout=2000
    )
    assert row.is_visible()
    has_kids = any(n["parent"] == deep["id"] for n in d["nodes"])
    want = deep["id"] if has_kids else deep["parent"]  # a leaf: its caller
    assert page.get_attribute("#flame", "data-level") == str(want)
    shot(page, "calltree-linked")
    page.click('#calltree-table tr[data-node="0"]')
    assert page.get_attribute("#flame", "data-level") == ""
    page.select_option("#flame-color", "library")
    legend = page.locator("#flame-legend .legend-item").all_inner_texts()
    assert "torch" in legend and len(legend) > 2, legend
    assert "color=library" in page.url
    colors = page.evaluate("document.getElementById('flame').data[0].marker.colors")
    lib = {}
    for n, c in zip(d["nodes"], colors, strict=True):
        # a capture names an installed package's files by import path (capture/relocate.py)
        if (n.get("file") or "").startswith("torch/") or "site-packages/torch/" in (
            n.get("file") or ""
        ):
            lib.setdefault("torch", set()).add(c)
        elif (n.get("file") or "").startswith("samples/"):
            lib.setdefault("samples", set()).add(c)
    assert len(lib["torch"]) == 1 and len(lib["samples"]) == 1 and lib["torch"] != lib["samples"]


def test_smaller_layout_fixes(server, page):
    """No Ranks tab on a one-rank profile; the profiler's own threads are not drawn as lanes;
    a long source line wraps inside its panel; the SQL page shows the schema (a click puts a
    column's name into the query) and the queries run before."""
    page.goto(server + "/p/cpu_mlp/timeline")
    page.wait_for_selector("#tl-canvas[data-ready]")
    assert page.locator("nav.tabs a", has_text="Ranks").count() == 0
    assert page.locator("nav.tabs a", has_text="Timeline").count() == 1
    lanes = page.evaluate("window.neTimeline.state.lanes.map((l) => l.track)")
    drawn = page.evaluate("window.neTimeline.state.rows.map((r) => r.lane.track)")
    assert {"thread PyTorch Profiler", "thread Trace PyTorch Profiler"} <= set(lanes)
    assert not any("PyTorch Profiler" in t or t.strip() == "thread" for t in drawn), drawn
    assert any(t.startswith("thread 7934") for t in drawn)
    shot(page, "timeline-no-profiler-lanes")
    # source: the longest line of the file stays inside its panel
    page.goto(server + "/p/gpt/source")
    page.click("a.file-link >> nth=0")
    page.wait_for_selector(".code td.src")
    panel = page.locator(".source-layout > *", has=page.locator(".code")).first.bounding_box()
    widest = max(
        c["x"] + c["width"]
        for c in (e.bounding_box() for e in page.locator(".code td.src").all()[:400])
    )
    assert widest <= panel["x"] + panel["width"] + 1
    # sql: schema and history
    page.goto(server + "/p/gpt/sql")
    page.wait_for_selector("#sql-schema")
    page.evaluate("localStorage.removeItem('ne.sql.history')")
    page.fill("#sql-input", "SELECT ")
    page.locator("#sql-schema a", has_text="dur_ns").first.click()
    assert page.input_value("#sql-input") == "SELECT dur_ns"
    page.fill("#sql-input", "SELECT count(*) AS n FROM events")
    page.click("#sql-run")
    page.wait_for_selector("#sql-status")
    page.fill("#sql-input", "SELECT 1 AS one")
    page.click("#sql-run")
    page.wait_for_selector("#sql-history li >> nth=1")
    assert page.locator("#sql-history li").all_inner_texts()[:2] == [
        "SELECT 1 AS one",
        "SELECT count(*) AS n FROM events",
    ]
    shot(page, "sql-schema-history")
    page.locator("#sql-history a").nth(1).click()
    page.wait_for_function(
        "() => document.querySelector('#sql-status') && document.querySelector('#sql-input').value.includes('count')"
    )
