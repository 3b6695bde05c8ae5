"""The real server under uvicorn, driven through Debian's Chromium with Playwright: every page
renders (plotly charts, the timeline canvas) without console errors, the timeline zooms, a
kernel leads to its source line, SQL runs, two profiles compare, and HTML in traces stays text.
Screenshots of each page go to screenshots/ (git-ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import uvicorn_server
from test_web_support import XSS_OP, build_root

pytestmark = pytest.mark.browser
SHOTS = Path(__file__).resolve().parent.parent / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory, imported_profiles):
    from neuron_explorer.web.app import create_app

    root = build_root(tmp_path_factory.mktemp("webui"), imported_profiles)
    app = create_app(root, analysis_cache=tmp_path_factory.mktemp("analysis-cache"))
    with uvicorn_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (make browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def context(browser):
    ctx = browser.new_context(viewport={"width": 1440, "height": 950})  # one cache: plotly.js once
    yield ctx
    ctx.close()


@pytest.fixture
def page(context):
    pg = context.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    pg.close()


def _open(page, url: str, shot: str, ready: str) -> None:
    page.goto(url)
    page.wait_for_selector(ready, timeout=30_000)
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
    assert page.errors == [], page.errors
    assert page.evaluate("window.__xss") is None


# plotly.js is 4.8 MB: parsing it costs seconds on a busy machine, so chart pages are few here
PAGES = [
    ("/", "profiles", "table.data tbody tr"),
    ("/p/neuron", "neuron-summary", "#step-chart .main-svg"),
    ("/p/gpt", "gpt-summary", "#busy-chart .main-svg"),
    ("/p/neuron/timeline", "neuron-timeline", "#tl-canvas[data-ready]"),
    ("/p/alexnet/timeline", "gpu-timeline", "#tl-canvas[data-ready]"),
    ("/p/gpt/timeline", "gpt-timeline", "#tl-canvas[data-ready]"),
    ("/p/neuron/source", "neuron-source", "a.file-link"),
    ("/p/alexnet/findings", "gpu-findings", ".finding"),
    ("/p/gpt/findings", "gpt-findings", ".finding"),
    ("/p/neuron/sql", "neuron-sql", "#sql-input"),
]


@pytest.mark.parametrize("url,shot,ready", PAGES, ids=[p[1] for p in PAGES])
def test_page_renders(server, page, url, shot, ready):
    _open(page, server + url, shot, ready)


def test_timeline_zooms_and_a_kernel_leads_to_its_line(server, page):
    _open(page, server + "/p/neuron/timeline", "timeline-before-zoom", "#tl-canvas[data-ready]")
    status = page.locator("#tl-status")
    span = float(status.get_attribute("data-end")) - float(status.get_attribute("data-start"))
    with page.expect_response(lambda r: "/timeline?start_ns=" in r.url):
        page.click("#tl-zoom-in")
        page.click("#tl-zoom-in")
    page.wait_for_function(  # a function, not a string: the page's CSP forbids eval
        "s => document.querySelector('#tl-status').dataset.end - document.querySelector('#tl-status').dataset.start < s",
        arg=span / 3,
    )
    box = page.locator("#tl-canvas").bounding_box()
    with page.expect_response(lambda r: "/timeline?start_ns=" in r.url):
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 60)
        page.mouse.wheel(0, -600)
    page.wait_for_timeout(300)
    target = page.evaluate("window.neTimeline.rectCenter('kernel')")
    assert target, "no kernel drawn wide enough to click after zooming"
    page.mouse.click(target["x"], target["y"])
    link = page.wait_for_selector("#event-source")
    page.screenshot(path=str(SHOTS / "timeline-kernel-selected.png"), full_page=True)
    line = int(link.inner_text().rsplit(":", 1)[1])
    link.click()
    page.wait_for_selector(f"#L{line}.target")
    page.wait_for_selector("#line-panel table.data")
    page.screenshot(path=str(SHOTS / "source-from-kernel.png"), full_page=True)
    assert page.url.endswith(f"#L{line}")
    assert page.errors == [], page.errors


def test_a_kernel_of_a_real_capture_leads_to_its_line(server, page):
    import httpx

    sql = ("SELECT start_ns, dur_ns FROM events WHERE kind = 'kernel' AND src_file IS NOT NULL "
           "ORDER BY dur_ns DESC LIMIT 1")  # fmt: skip
    s, d = httpx.get(f"{server}/api/p/gpt/sql", params={"q": sql}).json()["result"]["rows"][0]
    url = f"{server}/p/gpt/timeline?start_ns={s - 20 * d}&end_ns={s + 21 * d}"
    _open(page, url, "gpt-timeline-zoomed", "#tl-canvas[data-ready]")
    # the sixteen DMA queues start folded into one row; a click on its label unfolds them
    row_top = page.evaluate("window.neTimeline.state.rows.find((r) => r.count > 4).top")
    box = page.locator("#tl-canvas").bounding_box()
    page.mouse.click(box["x"] + 20, box["y"] + row_top + 8)
    assert page.evaluate("window.neTimeline.state.collapsed.size") == 0
    with page.expect_response(lambda r: "/timeline?start_ns=" in r.url):
        page.click("#tl-zoom-in")
    page.wait_for_timeout(300)
    target = page.evaluate("window.neTimeline.rectCenter('kernel')")
    page.mouse.click(target["x"], target["y"])
    link = page.wait_for_selector("#event-source")
    page.screenshot(path=str(SHOTS / "gpt-kernel-selected.png"), full_page=True)
    line = int(link.inner_text().rsplit(":", 1)[1])
    link.click()
    page.wait_for_selector(f"#L{line}.target")
    assert page.locator(f"#L{line} td.src").inner_text().strip()
    page.screenshot(path=str(SHOTS / "gpt-source-from-kernel.png"), full_page=True)
    assert page.errors == [], page.errors


def test_source_line_lists_ops_and_jumps_to_the_timeline(server, page):
    _open(page, server + "/p/neuron/source", "source-files", "a.file-link")
    page.click("a.file-link")
    page.wait_for_selector("#code")
    page.click("#L8")
    page.wait_for_selector("#line-events a.jump")
    page.click("#line-events a.jump")
    page.wait_for_selector("#event-source")  # the timeline opened on that op, details shown
    assert "/timeline?event=" in page.url
    assert page.errors == [], page.errors


def test_an_op_leads_to_its_line_in_a_real_capture(server, page):
    _open(page, server + "/p/gpt/operators", "gpt-operators", "#roofline-chart .main-svg")
    page.click("table.data tbody tr >> nth=0")
    link = page.wait_for_selector("a.op-line")
    line = int(link.inner_text().rsplit(":", 1)[1])
    link.click()
    page.wait_for_selector(f"#L{line}.target")
    assert page.locator(f"#L{line} td.src").inner_text().strip()  # the code of that line
    page.screenshot(path=str(SHOTS / "gpt-source-from-op.png"), full_page=True)
    assert page.errors == [], page.errors


def test_sql_query_runs_and_offers_csv(server, page):
    _open(page, server + "/p/neuron/sql", "sql-empty", "#sql-input")
    page.fill(
        "#sql-input", "SELECT track, count(*) AS n FROM events GROUP BY track ORDER BY n DESC"
    )
    page.click("#sql-run")
    page.wait_for_selector("#sql-status")
    rows = page.locator("#sql-result tbody tr")
    assert rows.count() == 7 and rows.first.locator("td").first.inner_text() == "thread 1"
    assert "/sql.csv?q=" in page.get_attribute("#sql-csv", "href")
    page.fill("#sql-input", "SELECT * FROM read_csv('/etc/passwd')")
    page.click("#sql-run")
    assert "disabled" in page.wait_for_selector("#sql-error").inner_text()
    page.screenshot(path=str(SHOTS / "sql-refused.png"), full_page=True)


def test_pick_two_profiles_and_compare(server, page):
    _open(page, server + "/", "profiles-pick", "table.data tbody tr")
    page.check('input.pick[data-name="base"]')
    page.check('input.pick[data-name="test"]')
    page.click("#compare-btn")
    page.wait_for_selector("#compare-chart .main-svg")
    assert "a=base" in page.url and "b=test" in page.url
    page.wait_for_selector("#findings-diff")
    page.fill("#kernels-box", "/gemm|sgemm|Kernel/")  # the kernel table's filter, kept in the URL
    page.wait_for_function("() => location.search.includes('kernels=')")
    assert page.inner_text("#kernels-count").endswith("of 3")
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)
    assert page.errors == [], page.errors


def test_html_in_traces_is_shown_as_text(server, page):
    _open(page, server + "/p/xss/operators", "xss-operators", "#ops-chart .main-svg")
    assert page.get_by_text(XSS_OP).count() >= 1  # the name is visible, as text
    _open(page, server + "/p/xss/source", "xss-source", "a.file-link")
    _open(page, server + "/p/xss/timeline", "xss-timeline", "#tl-canvas[data-ready]")
    page.goto(server + "/p/neuron/source")
    page.click("a.file-link")
    page.wait_for_selector("#code")
    assert "<script>window.__xss=4</script>" in page.locator("#L2").inner_text()
    assert page.evaluate("window.__xss") is None


def test_readiness_findings_come_first_and_say_so(server, page):
    _open(page, server + "/p/fallback/findings", "fallback-findings", ".finding")
    findings = page.locator(".finding")
    assert findings.count() >= 4
    known = ("cpu-fallback", "float64-downcast")  # the sample's porting problems
    first = [findings.nth(i).inner_text() for i in range(len(known))]
    assert all("READINESS" in t.upper() for t in first), first
    assert set(known) == {r for r in known for t in first if r in t}
    # its loss.item() per step runs right on the device: ranked by its (small) saving
    texts = [findings.nth(i).inner_text() for i in range(findings.count())]
    (sync,) = [t for t in texts if "host-sync" in t]
    assert "READINESS" not in sync.upper() and texts.index(sync) > len(known)
    assert "readiness" not in findings.nth(findings.count() - 1).inner_text().lower()


def test_findings_say_which_change_each_saving_replays_and_what_all_save_together(server, page):
    # fallback_float64: every saving there is a replay (cpu-fallback, launch-bound, host-sync,
    # the device-side ones at ~0 in its launch-bound steps); no correctness finding claims one
    _open(page, server + "/p/fallback/findings", "fallback-findings", ".finding")
    doc = page.evaluate("fetch('/api/p/fallback/findings').then((r) => r.json())")
    texts = {f["rule"]: page.locator(".finding").nth(i).inner_text()
             for i, f in enumerate(doc["findings"])}  # fmt: skip
    assert "Saving replayed: the host's per-op dispatch" in texts["launch-bound"]
    assert "Saving replayed: these 9 fallbacks" in texts["cpu-fallback"]
    assert "Saving replayed" not in texts["float64-downcast"]
    assert page.locator(".note.bound").count() == sum(1 for f in doc["findings"] if f["bound"])
    total = page.locator(".replayed-total").inner_text()
    assert 0 < doc["replayed_total_ns"] <= doc["total_step_ns"]
    assert f"All {sum(1 for f in doc['findings'] if f['replayed'])} replayed changes" in total
    assert not page.errors


def test_corrupt_profile_shows_an_error_page(server, page):
    page.goto(server + "/p/corrupt")
    assert "corrupt Parquet table" in page.locator(".error-box").inner_text()
    page.screenshot(path=str(SHOTS / "corrupt.png"), full_page=True)


def test_timeline_find_steps_through_and_highlights(server, page):
    """A deep link with ?find= selects the first match; ▼ ▲ step through the server's matches in
    time order (▲ from the first wraps to the last); matched names are outlined; a regex typed
    into the box (Enter) searches again and lands in the URL."""
    import httpx

    want = httpx.get(f"{server}/api/p/neuron/search", params={"q": "addmm"}).json()
    _open(page, server + "/p/neuron/timeline?find=addmm", "timeline-find", "#tl-canvas[data-ready]")
    count = page.wait_for_selector("#tl-find-count[data-total]")
    assert int(count.get_attribute("data-total")) == want["total"] > 0
    assert count.inner_text().startswith("1 / ")
    selected = lambda: page.evaluate("window.neTimeline.state.selected")  # noqa: E731
    page.wait_for_function(
        "id => window.neTimeline.state.selected === id", arg=want["matches"][0]["id"]
    )
    page.click("#tl-find-next")
    page.wait_for_function(
        "id => window.neTimeline.state.selected === id", arg=want["matches"][1]["id"]
    )
    page.click("#tl-find-prev")
    page.click("#tl-find-prev")
    page.wait_for_function(
        "id => window.neTimeline.state.selected === id", arg=want["matches"][-1]["id"]
    )
    assert selected() == want["matches"][-1]["id"]
    outlined = page.evaluate("""() => { const s = window.neTimeline.state, r = s.win.rects;
        return r.name.filter((n) => s.find.names.has(s.win.names[n])).length; }""")
    assert outlined > 0
    page.fill("#tl-find", "/^aten::(relu|softmax)$/")
    page.press("#tl-find", "Enter")
    regex = httpx.get(
        f"{server}/api/p/neuron/search", params={"q": "^aten::(relu|softmax)$", "regex": "true"}
    ).json()
    page.wait_for_function(
        "n => document.querySelector('#tl-find-count').dataset.total == n", arg=regex["total"]
    )
    assert "find=%2F%5Eaten" in page.url
    assert page.errors == []


def test_operator_filter_narrows_the_table_and_the_url(server, page):
    _open(page, server + "/p/neuron/operators?filter=add", "operators-filter", "#filter-box")
    rows = page.locator("div.filtered table.data tbody tr")
    names = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
    assert names and all("add" in n.lower() for n in names)
    page.fill("#filter-box", "/^aten::(relu|sum)$/")
    page.wait_for_function(
        "() => document.querySelector('#filter-count').textContent.startsWith('2 of')"
    )
    assert "filter=%2F%5Eaten" in page.url
    page.fill("#filter-box", "/(/")
    assert "bad regular expression" in page.inner_text("#filter-count")
    assert page.errors == []


def test_memory_page_draws_the_peak_and_what_was_held(server, page):
    import httpx

    d = httpx.get(f"{server}/api/p/gpt/memory").json()
    _open(page, server + "/p/gpt/memory", "memory", "#memory-chart .main-svg")
    peak = page.inner_text("#memory-peak")
    assert "memory_allocated" in peak.replace("\n", " ").lower() or "MEMORY_ALLOCATED" in peak
    drawn = page.evaluate("""() => { const gd = document.querySelector('#memory-chart');
        return gd.data.map((t) => Math.max(...t.y)); }""")
    assert max(drawn) == d["peak"]["value"]  # the peak is on the chart, not smoothed away
    rows = page.locator("section:has-text('by op') table.data tbody tr")
    assert rows.count() == len(d["peak"]["by_op"]) > 0
    page.click("a.mem-line >> nth=0")
    page.wait_for_selector("#code")
    _open(page, server + "/p/alexnet/memory", "memory-none", "#no-memory")


def test_timeline_draws_a_memory_track(server, page):
    """Below the lanes, one track per counter in the window (memory_allocated of the neuron
    device here), scaled to its maximum in view; a profile without counters has none."""
    import httpx

    _open(page, server + "/p/gpt/timeline", "timeline-memory", "#tl-canvas[data-ready]")
    st = page.evaluate("""() => { const s = window.neTimeline.state;
        return { rows: s.counterRows.length, name: s.counters[0].name, max: Math.max(...s.counters[0].max),
                 start: s.view[0], end: s.view[1] }; }""")
    want = httpx.get(f"{server}/api/p/gpt/counters", params={"start_ns": round(st["start"]), "end_ns": round(st["end"]),
                                                           "width_px": 1000}).json()["counters"]  # fmt: skip
    assert st["rows"] == len(want) == 1 and st["name"] == "memory_allocated"
    assert st["max"] == max(want[0]["max"])
    _open(page, server + "/p/alexnet/timeline", "timeline-no-memory", "#tl-canvas[data-ready]")
    assert page.evaluate("window.neTimeline.state.counterRows.length") == 0


def test_gpu_summary_shows_one_breakdown_and_the_top_kernels(server, page):
    _open(page, server + "/p/alexnet", "gpu-summary", "#step-chart .main-svg")
    panel = page.locator("section.panel", has_text="Top device kernels")
    assert panel.count() == 1 and "computation" in panel.inner_text()
    # one stacked bar per step: the breakdown's parts, which add up to the step
    names = page.evaluate(
        "Array.from(document.querySelectorAll('#step-chart .legendtext')).map(e => e.textContent)"
    )
    assert any(n.startswith("device compute") for n in names), names
    assert not any(n.startswith("host:") for n in names), names


def test_a_drag_totals_a_span(server, page):
    """A plain drag down across every lane selects a span of them all (as in Perfetto); the
    panel shows the server's totals for exactly the span drawn; Esc clears it."""
    import httpx

    _open(page, server + "/p/neuron/timeline", "timeline-before-span", "#tl-canvas[data-ready]")
    box = page.locator("#tl-canvas").bounding_box()
    y = box["y"] + 30  # just under the ruler
    page.mouse.move(box["x"] + box["width"] * 0.35, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] - 4, steps=5)
    page.mouse.up()
    assert page.evaluate("window.neTimeline.state.rangeLanes") is None  # every lane
    panel = page.wait_for_selector("#tl-span[data-events]")
    s, e = page.evaluate("window.neTimeline.state.range")
    want = httpx.get(
        f"{server}/api/p/neuron/span", params={"start_ns": round(s), "end_ns": round(e)}
    ).json()
    assert int(panel.get_attribute("data-events")) == want["events"] > 0
    text = panel.inner_text().lower()  # section titles are upper-cased by CSS
    assert "selected span" in text and "tensore" in text
    page.screenshot(path=str(SHOTS / "timeline-span.png"), full_page=True)
    page.keyboard.press("Escape")
    assert page.evaluate("window.neTimeline.state.range") is None
    assert page.errors == []


def test_the_selected_event_is_in_the_url(server, page):
    """Clicking an event puts it in the URL, and that URL opens with the event selected."""
    import httpx

    k = httpx.get(f"{server}/api/p/neuron/search", params={"q": "kernel_addmm", "limit": 5}).json()[
        "matches"
    ][2]
    window = f"start_ns={k['start_ns'] - k['dur_ns']}&end_ns={k['start_ns'] + 2 * k['dur_ns']}"
    _open(
        page, server + f"/p/neuron/timeline?{window}", "timeline-select", "#tl-canvas[data-ready]"
    )
    hit = page.evaluate("window.neTimeline.rectCenter('kernel')")
    assert hit, "no kernel drawn wide enough to click"
    page.mouse.click(hit["x"], hit["y"])
    page.wait_for_selector("#event-source")
    assert f"event={hit['id']}" in page.url
    link = page.url
    page.goto(link)
    page.wait_for_selector("#tl-canvas[data-ready]")
    assert page.evaluate("window.neTimeline.state.selected") == hit["id"]
    assert page.errors == []


def test_critical_path_draws_the_path_and_replays_a_speedup(server, page):
    """The Critical path page of a real CUDA trace's step: the pieces on the step's axis (each
    a link to its event on the timeline), the ops by share, a what-if replay typed in, and the
    whole path shown on the timeline (its events outlined, the rest faded)."""
    import httpx

    query = {"annotation": "[param|pytorch.model.alex_net|0|0|0|measure|forward]", "instance": 1}
    doc = httpx.get(f"{server}/api/p/alexnet/critical-path", params=query, timeout=60).json()
    url = f"{server}/p/alexnet/critical-path?" + httpx.QueryParams(query).__str__()
    _open(page, url, "alexnet-critical-path", "#cp-ops table")
    assert page.locator("#cp-bar a.cp-seg").count() == len(doc["segments"])
    top = next(o for o in doc["ops"] if o["saving_if_2x_ns"] is not None)
    page.fill("#whatif-speedup", f"{top['label']}=2")
    page.click("#whatif-run")
    page.wait_for_selector("#whatif-result:has-text('saves')")
    assert "2x faster" in page.locator("#whatif-result").inner_text()
    # each piece links to its event on the timeline
    widest = max(range(len(doc["segments"])), key=lambda i: doc["segments"][i]["dur_ns"])
    href = page.locator("#cp-bar a.cp-seg").nth(widest).get_attribute("href")
    assert f"event={doc['segments'][widest]['event_id']}" in href
    page.goto(server + href)
    page.wait_for_selector("#tl-canvas[data-ready]", timeout=30_000)
    assert page.errors == [], page.errors
    # the whole path on the timeline: its events outlined (the find state), the rest faded
    _open(page, url, "alexnet-critical-path", "#cp-ops table")
    page.click("#cp-timeline")
    page.wait_for_selector("#tl-canvas[data-ready]", timeout=30_000)
    ids = {s["event_id"] for s in doc["segments"] if s["event_id"] >= 0}
    found = page.evaluate("() => [...window.neTimeline.state.find.ids]")
    assert set(found) == ids
    count = page.locator("#tl-find-count")
    assert count.inner_text().startswith(f"critical path of {doc['label']}: ")
    assert count.get_attribute("data-total") == str(len(ids))
    assert page.errors == [], page.errors
