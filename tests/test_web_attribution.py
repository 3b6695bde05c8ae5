"""The web UI on a real capture of a Transformers GPT-2 (issue 12): from a kernel on the timeline
to its whole Python stack, from a frame to the library file's hot line (kept in the profile,
with its self and total device time), from that line back to its kernels; the module tree."""

from __future__ import annotations

import shutil

import pytest
from conftest import uvicorn_server
from test_attribution import _captured_once
from test_web_browser import ARGS, CHROMIUM

from neuron_explorer.model import Profile

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from neuron_explorer.web.app import create_app

    tmp = tmp_path_factory.mktemp("attribution-web")
    # the capture test_attribution made, when it ran in this session (one capture, not two)
    captured = _captured_once(tmp_path_factory, "gpt2", "handler")
    root = tmp / "profiles"
    root.mkdir()
    shutil.copytree(captured.path, root / "gpt2")
    with uvicorn_server(create_app(root, analysis_cache=tmp / "cache")) as url:
        yield url, Profile.open(root / "gpt2")


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = b.new_page(viewport={"width": 1440, "height": 950})
        pg.errors = []
        pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        yield pg
        b.close()


def test_a_kernel_opens_its_library_line_and_the_line_lists_its_kernels(served, page):
    url, p = served
    kid, start, dur = (
        p.duckdb()
        .execute(
            """SELECT id, start_ns, dur_ns FROM events WHERE kind = 'kernel'
           AND op_name = 'aten::addmm' AND module = 'transformer.h.0.attn.c_attn' LIMIT 1"""
        )
        .fetchall()[0]
    )
    page.goto(f"{url}/p/gpt2/timeline?event={kid}&start_ns={max(0, start - 3 * dur)}"
              f"&end_ns={start + 4 * dur}")  # fmt: skip
    frames = page.locator("#event-stack a.frame")
    frames.first.wait_for(timeout=90_000)
    assert page.locator("dd", has_text="transformer.h.0.attn.c_attn").count() == 1
    library = frames.filter(has_text="modeling_gpt2.py:")
    assert library.count() >= 3  # the attention call, the block's, the model's
    line = int(library.first.inner_text().rsplit(":", 1)[1])  # innermost: the c_attn call
    library.first.click()
    row = page.locator(f"#L{line}")
    row.wait_for(timeout=90_000)
    page.locator(f"#L{line}.target").wait_for(timeout=90_000)
    code = row.locator("td.src").inner_text()
    assert "self.c_attn(" in code  # the library's code, kept in the profile
    assert row.locator("td.total").inner_text().strip()  # device time under this line
    kernels = page.locator("#line-kernels li")
    kernels.first.wait_for(timeout=90_000)
    assert kernels.count() >= 1
    page.locator("#line-kernels a").first.click()  # and back to the timeline
    page.locator("#event-stack").wait_for(timeout=90_000)
    assert not page.errors, page.errors


def test_findings_link_their_model_lines_and_modules(served, page):
    url, _ = served
    page.goto(f"{url}/p/gpt2/findings")
    page.locator("a.finding-model-line").first.wait_for(timeout=90_000)
    assert page.locator("a.finding-module").count() >= 1
    page.locator("a.finding-model-line").first.click()
    page.locator("#code tr.target").wait_for(timeout=90_000)  # the line, in the source view
    assert not page.errors, page.errors


def test_the_module_tree_page_draws_the_icicle_and_the_table(served, page):
    url, _ = served
    page.goto(f"{url}/p/gpt2/modules")
    page.locator("#module-icicle .main-svg").first.wait_for(timeout=90_000)
    table = page.locator("#module-table").inner_text()
    assert "transformer.h.0.attn" in table and "(model)" in table
    page.goto(f"{url}/p/gpt2/source")
    page.locator("a.model-file").first.wait_for(timeout=90_000)
    assert page.locator("a.model-file", has_text="modeling_gpt2.py").count() == 1
    # the level of "the line" is the reader's choice, kept in the URL
    page.select_option("#line-level", "all")
    page.wait_for_url("**level=all**", timeout=90_000)
    page.locator("a.model-line").first.wait_for(timeout=90_000)
    assert page.locator("#line-level").input_value() == "all"
    assert "level=all" in page.locator("a.model-line").first.get_attribute("href")
    assert not page.errors, page.errors
