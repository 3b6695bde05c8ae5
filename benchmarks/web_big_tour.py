"""Every page and view of the web UI on one (large) profile, in a real browser (issue 31: "it
opens, on a laptop, and every view works"): `neuron-explorer serve P --max-memory M` as a user
starts it, then Chromium through Playwright visits each page and drives the timeline (whole
view, zoom, pan, step, an event, find, a selected span, deep links), and the exports are
downloaded. For each view: how long until it is drawn, every request's HTTP status, the page's
errors, and the server's resident memory (its peak during the view, sampled every 0.1 s).

    .venv/bin/python benchmarks/web_big_tour.py --profile DIR [--max-memory 2G] [--cache DIR]

--cache keeps the analysis cache (XDG_CACHE_HOME) between runs; by default it is a fresh,
empty one, removed after. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]  # fmt: skip
LIMIT_S = 180  # a view not drawn by then is reported as never drawn


class Server:
    """`neuron-explorer serve` in a child process, its RSS sampled from /proc every 0.1 s."""

    def __init__(self, profile: Path, max_memory: str, cache: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "neuron_explorer", "serve", str(profile), "--port", str(port),
               "--max-memory", max_memory]  # fmt: skip
        env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        self.peak = 0
        self._stop = False
        for _ in range(1200):  # up to a minute: imports are slow on a loaded machine
            try:
                httpx.get(self.base + "/static/app.css", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        else:
            self.proc.kill()
            raise RuntimeError("the server did not start")
        threading.Thread(target=self._sample, daemon=True).start()

    def _status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) >> 10
        return 0

    def _sample(self) -> None:
        while not self._stop and self.proc.poll() is None:
            try:
                self.peak = max(self.peak, self._status("VmRSS"))
            except OSError:
                return
            time.sleep(0.1)

    def rss(self) -> int:
        return self._status("VmRSS")

    def hwm(self) -> int:
        return self._status("VmHWM")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self._stop = True
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Tour:
    """One browser page; each view's requests, errors, draw time and the server's memory."""

    def __init__(self, page, server: Server) -> None:
        self.page, self.server = page, server
        self.pending: set = set()
        self.last_activity = time.perf_counter()
        self.responses: list[tuple[int, str, float]] = []
        self.times: dict[str, float] = {}  # each request's time, by path, once finished
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.rows: list[dict] = []
        page.on("request", self._request)
        page.on("requestfinished", self._done)
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        page.on(
            "console", lambda m: self.errors.append(m.text[:160]) if m.type == "error" else None
        )
        page.on("pageerror", lambda e: self.errors.append(str(e)[:160]))

    def _request(self, r) -> None:
        self.pending.add(r)
        self.last_activity = time.perf_counter()

    def _done(self, r) -> None:
        self.pending.discard(r)
        self.last_activity = time.perf_counter()
        timing = r.timing  # (complete only once the body is read)
        ms = max(0.0, timing.get("responseEnd", 0) - timing.get("requestStart", 0))
        self.times[_path(r.url)] = max(ms, self.times.get(_path(r.url), 0.0))

    def _failed(self, r) -> None:
        self._done(r)
        self.failed.append(f"{_path(r.url)} ({r.failure})")

    def _response(self, r) -> None:
        self.responses.append((r.status, _path(r.url), 0.0))

    def settle(self, limit: float, quiet: float = 0.6) -> bool:
        """Wait until no request has been in flight for `quiet` seconds (False at `limit`)."""
        end = time.perf_counter() + limit
        while time.perf_counter() < end:
            self.page.wait_for_timeout(100)
            if not self.pending and time.perf_counter() - self.last_activity >= quiet:
                return True
        return False

    def view(
        self, label: str, action: Callable[[], None], quiet: bool = True, page_view: bool = True
    ) -> None:
        """Run `action` (which returns once the view is drawn) and record the view
        (`page_view` False: a download, not the page)."""
        self.responses, self.failed, self.errors, self.times = [], [], [], {}
        self.server.peak = self.server.rss()
        t0 = time.perf_counter()
        drawn = ""
        try:
            action()
            drawn = f"{time.perf_counter() - t0:.1f} s"
            box = page_view and self.page.query_selector("#app .error-box")
            if box:
                drawn += f" (an error page: {box.inner_text()[:120]!r})"
        except Exception as e:  # noqa: BLE001 - a view that fails is a row, not the end
            drawn = f"NOT DRAWN after {time.perf_counter() - t0:.0f} s ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
        settled = self.settle(LIMIT_S if quiet else 2)
        if quiet and not settled:
            drawn += "; requests still in flight: " + ", ".join(_path(r.url) for r in self.pending)
        bad = [f"{s} {p}" for s, p, _ in self.responses if s >= 400] + self.failed
        timed = [(s, p, max(ms, self.times.get(p, 0.0))) for s, p, ms in self.responses]
        slow = max(timed, key=lambda x: x[2], default=None)
        self.rows.append({
            "view": label, "drawn": drawn, "requests": len(self.responses),
            "bad": "; ".join(bad) or "none",
            "slowest": f"{slow[1][:60]} {slow[2] / 1e3:.1f} s" if slow else "",
            "errors": "; ".join(dict.fromkeys(self.errors)) or "none",
            "rss": f"{self.server.peak:,}",
        })  # fmt: skip
        print(" | ".join(str(v) for v in self.rows[-1].values()), flush=True)

    # -- the actions ----------------------------------------------------------------------
    def open(self, url: str, ready: str | None = None) -> Callable[[], None]:
        """Go to `url`, wait until the page has replaced its "Loading…" (and `ready` shows)."""

        def go() -> None:
            self.page.goto(self.server.base + url, timeout=LIMIT_S * 1000)
            self.page.wait_for_function("() => !document.querySelector('#app .loading')",
                                        timeout=LIMIT_S * 1000)  # fmt: skip
            if ready and not self.page.query_selector("#app .error-box"):
                self.page.wait_for_selector(ready, timeout=LIMIT_S * 1000)

        return go

    def then(self, *steps: Callable[[], object]) -> Callable[[], None]:
        def go() -> None:
            for s in steps:
                s()

        return go

    def wait_quiet(self) -> None:
        if not self.settle(LIMIT_S):
            raise TimeoutError("requests still in flight")

    def click(self, selector: str) -> Callable[[], None]:
        return lambda: (self.page.click(selector, timeout=LIMIT_S * 1000), self.wait_quiet())


def _path(url: str) -> str:
    u = urlsplit(url)
    return u.path + ("?" + u.query if u.query else "")


def _timeline(t: Tour, name: str, ids: dict) -> None:
    """The timeline: whole view, zoom, pan, step, an event, find, a span, the deep links."""
    pg, tl = t.page, f"/p/{quote(name)}/timeline"
    ready = "#tl-canvas[data-ready]"
    t.view("timeline: whole profile (first view)", t.open(tl, ready))
    t.view("timeline: zoom in x3 (+)", t.then(*[t.click("#tl-zoom-in")] * 3))
    t.view("timeline: pan right x2 (▶)", t.then(*[t.click("button[title^='Pan right']")] * 2))
    t.view("timeline: zoom out (−)", t.click("#tl-zoom-out"))
    t.view(
        "timeline: overview strip clicked (move there)",
        t.then(lambda: _click_at(pg, "#tl-overview", 0.7, 0.5), t.wait_quiet),
    )
    t.view(
        "timeline: colour by name",
        t.then(lambda: pg.select_option("#tl-color", "name"), t.wait_quiet),
    )
    t.view(
        "timeline: a step from the step menu",
        t.then(lambda: pg.select_option("#tl-step", index=ids["step_index"]), t.wait_quiet),
    )

    def event() -> None:
        c = pg.evaluate(
            "window.neTimeline.rectCenter('kernel') || window.neTimeline.rectCenter('op')"
        )
        if not c:
            raise RuntimeError("no kernel or op drawn wide enough to click")
        pg.mouse.click(c["x"], c["y"])
        pg.wait_for_function("() => document.querySelector('#tl-details') && "
                             "!document.querySelector('#tl-details').textContent.includes('Loading event')",
                             timeout=LIMIT_S * 1000)  # fmt: skip
        t.wait_quiet()

    t.view("timeline: click an event (details, flows, stack)", event)

    def span() -> None:
        box = pg.locator("#tl-canvas").bounding_box()
        y = box["y"] + 40
        pg.mouse.move(box["x"] + box["width"] * 0.4, y)
        pg.mouse.down()
        pg.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] - 10, steps=5)
        pg.mouse.up()
        pg.wait_for_selector("#tl-span[data-events]", timeout=LIMIT_S * 1000)

    t.view("timeline: drag-select an area (span totals, flame graph)", span)
    t.view("timeline: whole profile again", t.click("#tl-reset"))

    def find(q: str) -> Callable[[], None]:
        def go() -> None:
            pg.fill("#tl-find", q)
            pg.press("#tl-find", "Enter")
            pg.wait_for_function("() => document.querySelector('#tl-find-count').textContent",
                                 timeout=LIMIT_S * 1000)  # fmt: skip
            t.wait_quiet()

        return go

    t.view("timeline: find 'addmm', first match", find("addmm"))
    t.view("timeline: find /^aten::(relu|add_)$/", find("/^aten::(relu|add_)$/"))
    t.view("timeline: a drag-selected span, whole profile wide", t.then(
        lambda: pg.evaluate("window.neTimeline.setView(window.neTimeline.state.extent.start_ns, "
                            "window.neTimeline.state.extent.end_ns)"),
        t.wait_quiet, span))  # fmt: skip
    if ids.get("line"):
        t.view(
            "timeline: a source line's events (?line=)", t.open(f"{tl}?line={ids['line']}", ready)
        )
    if ids.get("module") is not None:
        t.view("timeline: a module's events (?module=)",
               t.open(f"{tl}?module={quote(ids['module'])}", ready))  # fmt: skip
    if ids.get("path_step") is not None:
        t.view("timeline: a step's critical path (?path=1&step=)",
               t.open(f"{tl}?path=1&step={ids['path_step']}", ready))  # fmt: skip
    t.view("timeline: a link to an event (?event=)", t.open(f"{tl}?event={ids['event']}", ready))


def _click_at(pg, selector: str, fx: float, fy: float) -> None:
    box = pg.locator(selector).bounding_box()
    pg.mouse.click(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)


def _ids(base: str, name: str) -> dict:
    """What the deep links need (a source line, a module, a step, an event), read from the
    JSON the pages already fetched (so from the server's memory or disk cache)."""
    out: dict = {"step_index": 1, "event": 0}
    with httpx.Client(base_url=base, timeout=LIMIT_S) as c:
        src = c.get(f"/api/p/{quote(name)}/source").json()
        if src.get("top_lines"):
            top = src["top_lines"][0]
            out["line"], out["file_id"], out["line_no"] = (
                f"{top['file_id']}:{top['line']}",
                top["file_id"],
                top["line"],
            )
        mods = c.get(f"/api/p/{quote(name)}/modules").json().get("modules") or []
        if mods:
            out["module"] = mods[0].get("path", "")
        cp = c.get(f"/api/p/{quote(name)}/critical-path").json()
        label = str(cp.get("label", ""))
        if label.startswith("step "):
            out["path_step"] = label.split()[1]
        ops = c.get(f"/api/p/{quote(name)}/operators").json().get("operators") or []
        out["op"] = ops[0]["name"] if ops else None
        found = c.get(f"/api/p/{quote(name)}/search", params={"q": "addmm", "limit": 1}).json()
        if found.get("matches"):
            out["event"] = found["matches"][0]["id"]
    return out


def _exports(t: Tour, name: str) -> None:
    """The downloads (the SQL page's CSV, each table's Parquet), read to the end."""
    sql = "SELECT name, count(*) AS n, sum(dur_ns) AS t FROM events GROUP BY 1 ORDER BY 3 DESC"
    for label, url, params in (
        ("export: SQL result as CSV", f"/api/p/{quote(name)}/sql.csv", {"q": sql}),
        ("export: events table as Parquet", f"/api/p/{quote(name)}/tables/events.parquet", None),
        ("export: counters table as Parquet", f"/api/p/{quote(name)}/tables/counters.parquet", None),
    ):  # fmt: skip

        def get(url: str = url, params: dict | None = params) -> None:
            with httpx.Client(base_url=t.server.base, timeout=LIMIT_S) as c:
                t0, size = time.perf_counter(), 0
                with c.stream("GET", url, params=params) as r:
                    for chunk in r.iter_bytes():
                        size += len(chunk)
                t.responses.append((r.status_code, f"{url} ({size / 1e6:,.1f} MB)",
                                    (time.perf_counter() - t0) * 1e3))  # fmt: skip

        t.view(label, get, page_view=False)


def tour(profile: Path, max_memory: str, cache: Path | None) -> None:
    from playwright.sync_api import sync_playwright

    own_cache = cache is None
    cache = cache or Path(tempfile.mkdtemp(prefix="web-tour-cache-"))
    load0 = os.getloadavg()
    server = Server(profile, max_memory, cache)
    started = server.rss()
    wall0 = time.perf_counter()
    try:
        name = httpx.get(server.base + "/api/profiles", timeout=LIMIT_S).json()["profiles"][0][
            "name"
        ]
        p = f"/p/{quote(name)}"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            ctx = browser.new_context(viewport={"width": 1440, "height": 950})
            t = Tour(ctx.new_page(), server)
            t.view("profiles (/)", t.open("/", "table.data tbody tr"), quiet=False)
            t.view(
                "summary",
                t.then(
                    t.open(p),
                    lambda: t.page.wait_for_function(
                        "() => !document.querySelector('#findings-pending')", timeout=LIMIT_S * 1000
                    ),
                ),
            )
            t.view("findings", t.open(f"{p}/findings"))
            t.view("operators", t.open(f"{p}/operators", "table.data"))
            t.view("operators: a row's detail", t.click("table.data tbody tr"))
            t.view("modules", t.open(f"{p}/modules"))
            t.view("call tree (by stack)", t.open(f"{p}/calltree"))
            t.view("call tree (by module)", t.open(f"{p}/calltree?by=module"))
            t.view("source: files and top lines", t.open(f"{p}/source"))
            ids = _ids(server.base, name)
            if ids.get("file_id"):
                t.view("source: a file, its top line's panel", t.open(
                    f"{p}/source/{ids['file_id']}#L{ids['line_no']}", "#line-timeline"))  # fmt: skip
            t.view("critical path", t.open(f"{p}/critical-path"))
            t.view("critical path: what-if replay (its top op 2x faster)", t.then(
                lambda: t.page.fill("#whatif-speedup", f"{ids['op']}=2" if ids.get("op") else ""),
                t.click("#whatif-run")))  # fmt: skip
            t.view("ranks", t.open(f"{p}/ranks"))
            t.view("memory", t.open(f"{p}/memory"))
            t.view("SQL page", t.open(f"{p}/sql", "#sql-input"))
            q = "SELECT name, count(*) AS n, sum(dur_ns) AS t FROM events GROUP BY 1 ORDER BY 3 DESC"
            t.view("SQL: time by name over every event",
                   t.open(f"{p}/sql?q={quote(q)}", "#sql-status, #sql-error"))  # fmt: skip
            t.view(
                "compare (the profile with itself)",
                t.open(f"/compare?a={quote(name)}&b={quote(name)}"),
            )
            _timeline(t, name, ids)
            _exports(t, name)
            browser.close()
        rows = t.rows
    finally:
        hwm, cpu = server.hwm(), server.cpu_s()
        server.stop()
        if own_cache:
            shutil.rmtree(cache, ignore_errors=True)
    print(f"\n`serve {profile} --max-memory {max_memory}`: started at {started:,} MB; the tour "
          f"took {time.perf_counter() - wall0:.0f} s wall, {cpu:.0f} s of server CPU; the server's "
          f"peak (VmHWM) {hwm:,} MB; load average {load0[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after\n")  # fmt: skip
    print(
        "| view | drawn in | requests | not 200 | slowest request | page errors | server RSS peak MB |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(v).replace("|", "\\|") for v in r.values()) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--max-memory", default="2G")
    ap.add_argument(
        "--cache", type=Path, default=None, help="XDG_CACHE_HOME to keep (default: a fresh one)"
    )
    a = ap.parse_args()
    tour(a.profile, a.max_memory, a.cache)


if __name__ == "__main__":
    main()
