"""Issue 17 in Debian's Chromium (Playwright) against the real server under uvicorn: op names
that are HTML stay text in plotly's charts (no live link, no 120 px text) under the server's
CSP with no console error; a right-to-left override shows as a visible mark; a long kernel name
stays inside its column; a validation error reads as a sentence; the profile list waits for a
background analysis without reloading (a ticked box stays ticked); a page on another origin
cannot call the API."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from test_web_browser import ARGS, CHROMIUM
from test_web_security import far_events
from test_web_support import synth_module

from neuron_explorer.importers import import_traces

pytestmark = pytest.mark.browser
LINK = '<a href="https://evil.example/" target="_blank">click me</a>'
BIG = '<span style="font-size:120px">HUGE</span>'
BIDI_OP = "aten::evil\u202egnp.py"
LONG_KERNEL = "void cutlass::Kernel<" + "very_long_template_argument_" * 12 + ">"


def hostile_trace(path: Path) -> Path:
    """A Kineto trace: an op named as a link launches a kernel with a 350-character name, an
    op named as a styled span, and an op whose name holds a right-to-left override."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 2000, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": LINK, "pid": 1, "tid": 1, "ts": 1010, "dur": 300, "args": {"External id": 5}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1020, "dur": 10,
         "args": {"correlation": 7, "External id": 5}},
        {"ph": "X", "cat": "kernel", "name": LONG_KERNEL, "pid": 0, "tid": 7, "ts": 1100, "dur": 500,
         "args": {"correlation": 7, "device": 0, "stream": 7, "External id": 5}},
        {"ph": "X", "cat": "cpu_op", "name": BIG, "pid": 1, "tid": 1, "ts": 1400, "dur": 200, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": BIDI_OP, "pid": 1, "tid": 1, "ts": 1700, "dur": 100, "args": {}},
    ]  # fmt: skip
    path.write_text(
        json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000 * 10**9})
    )
    return path


class Base(str):
    """The server's URL, carrying its app (for what only the server can see)."""

    def __new__(cls, url: str, app: object) -> Base:
        self = super().__new__(cls, url)
        self.app = app
        return self


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory, imported_profiles):
    """hostile (above), small (a real GPU trace), big (200,004 events, so the list analyses
    it in the background) and far (two events at 9e18 ns), on the server's own app and
    protocol."""
    import uvicorn

    from neuron_explorer.web.app import create_app
    from neuron_explorer.web.guard import IdleTimeoutProtocol

    tmp = tmp_path_factory.mktemp("hostile")
    root = tmp / "profiles"
    root.mkdir()
    import_traces([hostile_trace(tmp / "hostile.json")], root / "hostile")
    shutil.copytree(imported_profiles["compare_base"], root / "small")
    synth_module().make_profile(root / "big", 210_000)
    far_events(imported_profiles["compare_base"], root / "far")
    port = free_port()
    app = create_app(root, analysis_cache=tmp / "cache")
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        http=IdleTimeoutProtocol))  # fmt: skip
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield Base(f"http://127.0.0.1:{port}", app)
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (make browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1440, "height": 950})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()


def test_plotly_shows_html_names_as_text(server, page):
    page.goto(f"{server}/p/hostile/operators")
    page.wait_for_selector("#ops-chart .main-svg")
    chart = page.locator("#ops-chart")
    assert chart.locator("a").count() == 0  # no live link in the chart
    sizes = page.eval_on_selector_all("#ops-chart text, #ops-chart tspan",
                                      "els => els.map(e => getComputedStyle(e).fontSize)")  # fmt: skip
    assert "120px" not in sizes
    ticks = " ".join(
        page.eval_on_selector_all("#ops-chart .ytick text", "els => els.map(e => e.textContent)")
    )
    assert "<a href=" in ticks and "<span style=" in ticks  # the names, as text
    page.goto(f"{server}/p/hostile")
    page.wait_for_selector("#app table.data")
    assert page.errors == [], page.errors  # the CSP lets every script and chart through


def test_bidi_override_is_shown_not_obeyed(server, page):
    page.goto(f"{server}/p/hostile/operators")
    page.wait_for_selector("#app table.data tbody tr")
    text = page.inner_text("#app")
    assert "\u202e" not in text and "aten::evil\ufffdgnp.py" in text


def test_long_kernel_name_stays_in_its_column(server, page):
    page.goto(f"{server}/p/hostile/operators")
    page.wait_for_selector("#app table.data tbody tr")
    page.locator("#app table.data tbody tr", has_text="click me").first.click()
    cell = page.locator(".detail-row .grid3 table.data td", has_text=LONG_KERNEL[:30]).first
    cell.wait_for()
    column = cell.locator("xpath=ancestor::div[parent::div[contains(@class, 'grid3')]]")
    cell_box, col_box = cell.bounding_box(), column.bounding_box()
    assert cell_box["x"] + cell_box["width"] <= col_box["x"] + col_box["width"] + 1
    # on one line, cut with an ellipsis, whole in its title
    assert cell.get_attribute("title") == LONG_KERNEL
    assert cell_box["height"] < 2 * float(
        cell.evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
    )


def test_validation_error_reads_as_a_sentence(server, page):
    page.goto(f"{server}/p/small/timeline?start_ns=soon&end_ns=1")
    msg = page.wait_for_selector(".error-box p").inner_text()
    assert msg.startswith("start_ns: ") and "[object Object]" not in msg


def test_profile_list_waits_without_reloading(server, page):
    page.goto(server + "/")
    page.wait_for_selector("text=analysing…", timeout=30_000)
    page.evaluate("window.__stayed = 1")
    page.check('input.pick[data-name="small"]')
    page.wait_for_selector("text=analysing…", state="detached", timeout=120_000)
    assert page.evaluate("window.__stayed") == 1  # the same document: never reloaded
    assert page.is_checked('input.pick[data-name="small"]')
    page.check('input.pick[data-name="big"]')
    assert page.is_enabled("#compare-btn")


def test_a_page_elsewhere_cannot_call_the_api(server, page):
    """A page served from another origin fires runaway queries at the API (an image, no-cors
    fetches): the browser marks them cross-site, the server refuses them before any runs (its
    SQL gate admits none), and the browser does not hand even the refusal to the page (CORP)."""
    forever = "SELECT%20count(*)%20FROM%20events%20a,%20events%20b,%20events%20c%20WHERE%20a.id%20%2B%20b.id%20%2B%20c.id%20=%20-1"
    url = f"{server}/api/p/small/sql?q={forever}"
    other = tmp_html_server(
        f"""<img src="{url}"><script>for (let i = 0; i < 5; i++) fetch("{url}&limit=" + i,
        {{mode: "no-cors"}}).catch(() => {{}});</script>"""
    )
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.failure) if "/api/" in r.url else None)
    gate = server.app.state.sql_gate
    page.goto(other)
    page.wait_for_timeout(1500)
    assert gate.admitted == 0  # nothing queued or running
    assert len(failed) == 6 and all("BLOCKED_BY_RESPONSE" in f for f in failed), failed


def tmp_html_server(body: str) -> str:
    """Serve one HTML page on another 127.0.0.1 port (another origin) in a daemon thread."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://localhost:{httpd.server_address[1]}/"


def test_strays_do_not_empty_the_whole_view(server, page):
    """Two events at 9e18 ns: the timeline opens on the other events, says two lie outside,
    and "show all" widens the view to them."""
    page.goto(f"{server}/p/far/timeline")
    page.wait_for_selector("#tl-canvas[data-ready]")
    note = page.inner_text("#tl-outside")
    assert note.startswith("2 stray events outside")
    fitted = page.evaluate("window.neTimeline.state.view")
    assert fitted[1] - fitted[0] < 10**12
    page.click("#tl-show-all")
    page.wait_for_function(  # the view is kept as ns after the profile's origin
        "() => window.neTimeline.state.origin + window.neTimeline.state.view[1] >= 3.99e18"
    )
    page.wait_for_timeout(500)  # the window for the wider view has been asked for
    assert page.errors == [], page.errors
