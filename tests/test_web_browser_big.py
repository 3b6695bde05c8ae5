"""What failed on the 10 GB trace's profile, in Chromium (benchmarks/web_big_tour.py): an
event whose details the server cannot give (there a 500 of DuckDB's memory, here an event
that does not exist) is said in the timeline's side panel, with the timeline drawn, never an
endless "Loading event…" nor the whole page replaced by the error."""

from __future__ import annotations

import pytest
from test_web_browser import SHOTS, browser, context, page, server  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser]


def test_an_event_the_server_cannot_give_is_said_in_the_side_panel(server, page):  # noqa: F811
    page.goto(server + "/p/alexnet/timeline?event=999999999")
    page.wait_for_selector("#tl-canvas[data-ready]", timeout=30_000)
    said = page.wait_for_selector("#tl-details #event-error", timeout=30_000).inner_text()
    assert "Event 999999999" in said and "999999999" in said.split(":", 1)[1], said
    assert "Loading event" not in page.locator("#tl-details").inner_text()
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "timeline-event-error.png"), full_page=True)
    # the only error the page logs is the refused request itself
    assert all("404" in e for e in page.errors), page.errors
