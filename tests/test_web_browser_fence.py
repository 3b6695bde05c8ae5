"""Issue 29 in Debian's Chromium (Playwright) against the real server under uvicorn, on the
profiles of tests/hostile_paths.py: a counter's unit that is HTML stays text in the memory
chart (its axis title and its hover label: no live link, no 90 px text), and a right-to-left
override in an event name shows as a visible mark in the timeline's hover tooltip."""

from __future__ import annotations

import threading
import time

import pytest
from hostile_paths import BIDI_NAME, make
from test_web_browser_hostile import browser, free_port, page  # noqa: F401 - the fixtures

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import uvicorn

    from neuron_explorer.web.app import create_app
    from neuron_explorer.web.guard import IdleTimeoutProtocol

    tmp = tmp_path_factory.mktemp("fence")
    hostile = make(tmp / "made")
    port = free_port()
    app = create_app(hostile.served, analysis_cache=tmp / "cache")
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        http=IdleTimeoutProtocol))  # fmt: skip
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


def _font_sizes(page, selector: str) -> list[str]:  # noqa: F811
    return page.eval_on_selector_all(f"{selector} text, {selector} tspan",
                                     "els => els.map(e => getComputedStyle(e).fontSize)")  # fmt: skip


def test_a_counter_unit_that_is_html_stays_text(server, page):  # noqa: F811
    page.goto(f"{server}/p/unit-html/memory")
    page.wait_for_selector("#memory-chart .main-svg")
    chart = page.locator("#memory-chart")
    title = page.text_content("#memory-chart .ytitle")
    assert "<a href=" in title and "<span style=" in title  # the unit, as text
    page.evaluate("""() => { const el = document.getElementById('memory-chart');
        window.Plotly.Fx.hover(el, [{curveNumber: 0, pointNumber: 2}]); }""")
    hover = page.wait_for_selector("#memory-chart .hoverlayer .hovertext")
    assert "<a href=" in hover.text_content()  # the hover label's unit, as text too
    assert chart.locator("a").count() == 0  # no live link anywhere in the chart
    assert "90px" not in _font_sizes(page, "#memory-chart")
    assert page.errors == [], page.errors


def test_a_bidi_override_is_shown_in_the_timeline_tooltip(server, page):  # noqa: F811
    page.goto(f"{server}/p/bidi/timeline")
    page.wait_for_selector("#tl-canvas")
    page.wait_for_function(
        "document.getElementById('tl-status').textContent.includes('rectangles')"
    )
    # sweep the pointer over the canvas until the tooltip names the op
    shown = page.evaluate("""() => {
        const c = document.getElementById('tl-canvas'), r = c.getBoundingClientRect();
        const tip = document.querySelector('.tl-tip');
        for (let y = r.top + 2; y < r.bottom; y += 4)
          for (let x = r.left + 2; x < r.right; x += 3) {
            c.dispatchEvent(new MouseEvent('mousemove', {clientX: x, clientY: y, bubbles: true}));
            if (!tip.hidden && tip.textContent.includes('aten::evil')) return tip.textContent;
          }
        return null; }""")
    assert shown is not None, "no tooltip named the op"
    assert "\u202e" not in shown and BIDI_NAME.replace("\u202e", "\ufffd") in shown
    assert page.errors == [], page.errors
