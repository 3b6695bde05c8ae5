"""Issue 17's pages and timeline in Chromium against the real server (as test_web_browser.py):
the call tree and flame graph of a real capture, the GPU-first summary of a real CUDA trace,
a hot source line outlined on the timeline, find in a source file, and the timeline's lanes
(fold, pin, height), overview strip, colours and details side panel."""

from __future__ import annotations

import re

import httpx
import pytest
from test_web_browser import SHOTS, _open, browser, context, page, server  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # each drives Chromium for seconds


def test_call_tree_and_flame_graph_of_a_capture(server, page):  # noqa: F811
    d = httpx.get(f"{server}/api/p/gpt/calltree").json()
    _open(page, server + "/p/gpt/calltree", "gpt-calltree", "#flame .main-svg")
    rows = page.locator("#calltree-table tbody tr")
    shown = rows.count()
    assert shown > 5  # the heaviest path opens on load
    top = rows.nth(1)  # the root's heaviest child: the script's outermost frame
    kids = sorted((n for n in d["nodes"] if n["parent"] == 0), key=lambda n: -n["total_ns"])
    assert top.get_attribute("data-node") == str(kids[0]["id"])
    top.click()  # folds it: only the root and its children are left
    assert rows.count() == 1 + len(kids)
    assert page.locator("#modules-link").get_attribute("href") == "/p/gpt/modules"
    link = page.locator("#calltree-table a.src-link")
    with_file = [n for n in d["nodes"] if n["file_id"]]
    assert with_file and d["has_stacks"]
    page.click("#by-module")
    page.wait_for_selector("#flame .main-svg")
    assert "by=module" in page.url
    assert page.locator("#calltree-table tr[data-kind=module]").count() > 0
    assert link.count() == 0 or link.first.get_attribute("href").startswith("/p/gpt/source/")
    assert page.errors == [], page.errors


def test_a_gpu_trace_leads_with_its_gpu(server, page):  # noqa: F811
    s = httpx.get(f"{server}/api/p/alexnet").json()["summary"]
    _open(page, server + "/p/alexnet", "gpu-first-summary", "#gpu-devices-chart .main-svg")
    cards = page.locator("#gpu-cards").inner_text()
    for label in ("GPU COMPUTE", "COMMUNICATION", "COMM. OVERLAP", "MEMCPY / MEMSET", "GPU IDLE"):
        assert label in cards.upper(), cards
    assert "MFU" not in cards.upper()  # no empty neuron-only cards
    kernels = page.locator("section:has(h2:text('Top device kernels')) tbody tr")
    assert kernels.count() == len(s["top_kernels"]) > 0
    assert page.locator("#gpu-devices tbody tr").count() == len(s["devices"])
    assert page.locator("#busy-chart").count() == 0  # no host "busy" bar
    # the operators page: no half-empty roofline panel without a device spec
    _open(page, server + "/p/alexnet/operators", "gpu-operators", "#ops-chart .main-svg")
    assert (
        page.locator("#no-roofline").count() == 1 and page.locator("#roofline-chart").count() == 0
    )
    # a neuron capture keeps its modeled summary with MFU and the roofline
    _open(page, server + "/p/gpt", "gpt-summary-still", "#busy-chart .main-svg")
    assert (
        page.locator("#gpu-cards").count() == 0
        and "MFU" in page.locator(".cards").first.inner_text()
    )


def test_a_hot_line_is_outlined_on_the_timeline(server, page):  # noqa: F811
    src = httpx.get(f"{server}/api/p/gpt/source").json()
    hot = src["top_lines"][0]
    expected = httpx.get(
        f"{server}/api/p/gpt/source/{hot['file_id']}/lines/{hot['line']}/events"
    ).json()
    _open(
        page,
        f"{server}/p/gpt/source/{hot['file_id']}#L{hot['line']}",
        "line-to-timeline",
        "#line-timeline",
    )
    page.click("#line-timeline")
    page.wait_for_selector("#tl-canvas[data-ready]", timeout=30_000)
    count = page.locator("#tl-find-count")
    assert count.get_attribute("data-total") == str(expected["total"])
    assert count.inner_text().startswith(f"line {hot['file'].split('/')[-1]}:{hot['line']}: 1 /")
    # the first of them is selected and every drawn event of the line is outlined
    assert page.evaluate("window.neTimeline.state.selected") == expected["matches"][0]["id"]
    outlined = page.evaluate("""() => { const s = window.neTimeline.state;
        return s.hits.filter(([x, y, w, i]) => s.find.ids.has(s.win.rects.id[i])).length; }""")
    assert outlined > 0
    page.click("#tl-find-next")
    page.wait_for_function(
        "() => window.neTimeline.state.selected !== null && document.querySelector('#tl-find-count').textContent.includes(': 2 /')"
    )
    page.screenshot(path=str(SHOTS / "timeline-line-outlined.png"), full_page=True)
    assert page.errors == [], page.errors


def test_find_in_a_source_file(server, page):  # noqa: F811
    src = httpx.get(f"{server}/api/p/gpt/source").json()
    fid = src["top_lines"][0]["file_id"]
    code = httpx.get(f"{server}/api/p/gpt/source/{fid}").json()["lines"]
    hot = next(line["code"] for line in code if line["line"] == src["top_lines"][0]["line"])
    word = re.findall(r"[A-Za-z_]{3,}", hot)[0].upper()  # any case matches
    want = [line["line"] for line in code if line["code"] and word.lower() in line["code"].lower()]
    assert want
    _open(page, f"{server}/p/gpt/source/{fid}?find={word}", "source-find", "#code tr.found")
    assert page.locator("#code tr.found").count() == len(want)
    page.locator("#src-find").press("Enter")
    assert page.locator("#code tr.current").get_attribute("id") == f"L{want[0]}"
    page.click("#src-find-prev")  # back round to the last
    assert page.locator("#code tr.current").get_attribute("id") == f"L{want[-1]}"
    page.fill("#src-find", "/^\\s*def /")
    defs = [
        line["line"] for line in code if line["code"] and line["code"].lstrip().startswith("def ")
    ]
    assert page.locator("#code tr.found").count() == len(defs)
    assert "find=" in page.url
    assert page.errors == [], page.errors


def test_timeline_lanes_overview_colours_and_side_panel(server, page):  # noqa: F811
    _open(page, server + "/p/gpt/timeline", "timeline-nav", "#tl-canvas[data-ready]")
    st = "window.neTimeline.state"
    lanes = page.evaluate(f"{st}.rows.map((r) => [r.index, r.rows, r.lane.depth])")
    deep = next(i for i, rows, depth in lanes if rows > 1)
    # fold a nested lane into one row, and back
    page.evaluate(f"window.neTimeline.laneClick({st}.rows.find((r) => r.index === {deep}), false)")
    assert page.evaluate(f"{st}.rows.find((r) => r.index === {deep}).rows") == 1
    page.evaluate(f"window.neTimeline.laneClick({st}.rows.find((r) => r.index === {deep}), false)")
    # pin the last lane: a click on its pin mark puts it first
    last = page.evaluate(f"{st}.rows.filter((r) => !r.count).pop()")
    box = page.locator("#tl-canvas").bounding_box()
    page.mouse.click(box["x"] + 190 - 8, box["y"] + last["top"] + 8)
    assert page.evaluate(f"{st}.rows[0].index") == last["index"]
    assert page.evaluate(f"[...{st}.pinned]") == [last["index"]]
    # a lane is as tall as what the window draws: a narrow window draws less nesting
    with page.expect_response(lambda r: "/timeline?start_ns=" in r.url):
        page.evaluate(
            f"window.neTimeline.setView({st}.origin + {st}.view[0], "  # the view: ns after the origin
            f"{st}.origin + {st}.view[0] + ({st}.view[1] - {st}.view[0]) / 2000)"
        )
    page.wait_for_timeout(200)
    rows = page.evaluate(f"{st}.rows.filter((r) => !r.count).map((r) => [r.rows, r.lane.depth])")
    assert any(r < d for r, d in rows), rows
    # the overview: a click at a quarter of its width centres the view there
    ov = page.locator("#tl-overview").bounding_box()
    whole = page.evaluate(
        "[window.neTimeline.state.fit || window.neTimeline.state.extent].map((w) => [w.start_ns, w.end_ns])[0]"
    )
    with page.expect_response(lambda r: "/timeline?start_ns=" in r.url):
        page.mouse.click(ov["x"] + 190 + (ov["width"] - 190) * 0.25, ov["y"] + ov["height"] / 2)
    view = page.evaluate(f"{st}.view")
    centre = page.evaluate(f"{st}.origin") + (view[0] + view[1]) / 2
    assert abs(centre - (whole[0] + 0.25 * (whole[1] - whole[0]))) < 0.02 * (whole[1] - whole[0])
    # colour by name, kept in the link
    page.select_option("#tl-color", "name")
    assert "color=name" in page.url and page.evaluate(f"{st}.colorMode") == "name"
    # a kernel's details in the side panel, with its whole Python stack: zoomed to the first
    # tenth of the first step, where the forward launches its first kernels
    step = httpx.get(f"{server}/api/p/gpt/timeline?width_px=1000").json()["steps"][0]
    s0, s1 = step["start_ns"], step["start_ns"] + step["dur_ns"] // 10
    with page.expect_response(lambda r: "/timeline?start_ns=" in r.url):
        page.evaluate(f"window.neTimeline.setView({s0}, {s1})")
    page.wait_for_timeout(200)
    target = page.evaluate("window.neTimeline.rectCenter('kernel')")
    assert target
    page.mouse.click(target["x"], target["y"])
    page.wait_for_selector("#tl-details #event-stack li")
    panel = page.locator("#tl-details").bounding_box()
    assert panel["x"] > box["x"] + box["width"] - 5  # beside the lanes, not below them
    page.screenshot(path=str(SHOTS / "timeline-side-panel.png"), full_page=True)
    assert page.errors == [], page.errors


def test_compare_stacks_the_same_step_of_both_on_one_scale(server, page):  # noqa: F811
    steps = {
        n: httpx.get(f"{server}/api/p/{n}/timeline?width_px=1000").json()["steps"]
        for n in ("base", "test")
    }
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/timeline?start_ns=" in r.url else None)
    _open(page, f"{server}/compare?a=base&b=test", "compare-stacked", "#cmp-tl-b[data-ready]")
    span = max(steps["base"][0]["dur_ns"], steps["test"][0]["dur_ns"])
    assert float(page.locator("#cmp-tl-status").get_attribute("data-span")) == span
    for n in ("base", "test"):  # each drawn from its own step's start, over the same span
        s = steps[n][0]["start_ns"]
        assert any(f"/p/{n}/timeline?start_ns={s}&end_ns={s + span}&" in u for u in asked), asked
    # a window asks for its rects only: the lanes and steps came with the first view
    assert asked and all(u.endswith("&window_only=true") for u in asked), asked
    with page.expect_response(lambda r: "/p/test/timeline?start_ns=" in r.url):
        page.click("#cmp-tl-in")
    page.wait_for_function(
        "s => Number(document.querySelector('#cmp-tl-status').dataset.span) < s", arg=span * 0.6
    )
    assert page.errors == [], page.errors


def test_find_in_the_call_tree_opens_every_path_to_a_match(server, page):  # noqa: F811
    nodes = httpx.get(f"{server}/api/p/gpt/calltree").json()["nodes"]
    by_id = {n["id"]: n for n in nodes}
    hits = {n["id"] for n in nodes if n["id"] and "adam" in n["name"].lower()}
    assert hits

    def outermost(i):  # no match above it
        p = by_id[i]["parent"]
        while p >= 0:
            if p in hits:
                return False
            p = by_id[p]["parent"]
        return True

    held = sum(by_id[i]["total_ns"] for i in hits if outermost(i))
    _open(page, server + "/p/gpt/calltree?find=ADAM", "calltree-find", "#calltree-table tr.found")
    count = page.locator("#calltree-find-count")
    assert int(count.get_attribute("data-nodes")) == len(hits)
    assert int(count.get_attribute("data-held-ns")) == held
    assert page.locator("#calltree-table tr.found").count() == len(hits)  # every path opened
    assert page.errors == [], page.errors
