"""The web's registry (web/routes) is the app: every page is registered once with its HTML
shell and its JSON twin, both answer on a real capture, the app serves no route the registry
does not declare, and docs/web.md lists every route the app serves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ForwardRef

import pytest
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Mount

from neuron_explorer.web.app import create_app
from neuron_explorer.web.routes import API, PAGES

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "profiles" / "fallback_float64"
# how docs/web.md spells a path parameter
DOC_NAMES = {"name": "NAME", "event_id": "ID", "file_id": "FILE_ID", "line": "N", "table": "TABLE"}
# served by the app itself, not by a page: the OpenAPI document and the static files
FRAMEWORK = {"/api/openapi.json", "/static", "/static/plotly.min.js"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    return create_app(SAMPLE, analysis_cache=tmp_path_factory.mktemp("cache"))


def _routes(app) -> dict[str, object]:
    return {r.path: r for r in app.routes if isinstance(r, APIRoute | Mount)}


def test_every_page_has_a_twin_and_nothing_is_registered_twice():
    paths = [p.path for p in PAGES] + [p.api_path for p in PAGES] + [a.path for a in API]
    assert len(paths) == len(set(paths)), "a path registered twice"
    kinds = {p.kind for p in PAGES}
    for page in PAGES:
        assert page.api_path.startswith("/api/") and callable(page.twin), page
    for api in API:
        assert api.path.startswith("/api/") and api.page in kinds, api


def test_the_app_serves_exactly_the_registry(app):
    declared = {p.path for p in PAGES} | {p.api_path for p in PAGES} | {a.path for a in API}
    assert set(_routes(app)) - FRAMEWORK == declared


def test_fastapi_reads_every_annotation_of_the_twins(app):
    # a twin's JSON goes through its declared response model (dict[str, Any]) as before the
    # registry, but for the twins that answer a Response of their own (the downloads, and the
    # timeline's windows, encoded by msgspec: web/responses.py `encoded`), and the OpenAPI
    # document describes every route
    for route in (r for r in app.routes if isinstance(r, APIRoute)):
        assert not isinstance(route.response_model, ForwardRef), route.path
        for param in route.dependant.query_params:
            assert not isinstance(param.field_info.annotation, ForwardRef), (route.path, param)
    json_routes = [r for r in app.routes if isinstance(r, APIRoute) and r.path.startswith("/api/")]
    own = {r.path for r in json_routes if r.endpoint.__signature__.return_annotation is Response}
    assert own == {"/api/p/{name}/sql.csv", "/api/p/{name}/tables/{table}.parquet",
                   "/api/p/{name}/timeline"}  # fmt: skip
    assert all(r.response_model is not None for r in json_routes if r.path not in own)
    documented = TestClient(app).get("/api/openapi.json").json()["paths"]
    assert {r.path for r in json_routes} - {"/api/openapi.json"} <= set(documented)


@pytest.mark.slow
def test_every_page_and_its_twin_answer_on_a_real_capture(app):
    client = TestClient(app)
    name = SAMPLE.name
    files = client.get(f"/api/p/{name}/source").json()["files"]
    values = {"name": name, "file_id": files[0]["file_id"]}
    for page in PAGES:
        path = re.sub(r"{(\w+)}", lambda m: values[m.group(1)], page.path)
        query = {"a": name, "b": name} if page.kind == "compare" else {}
        shell = client.get(path, params=query)
        assert shell.status_code == 200 and "text/html" in shell.headers["content-type"], path
        assert f'src="/static/js/{page.shell.script}"' in shell.text, path
        tabs = re.findall(r'<a href="[^"]*"(?: class="active")?>([^<]+)</a>', shell.text)
        assert len(tabs) == len(set(tabs)), (path, tabs)  # each tab once, the page's lit
        if page.shell.tab:
            assert f'class="active">{page.shell.tab}<' in shell.text, path
        twin = client.get("/api" + path if not page.api else page.api, params=query)
        assert twin.status_code == 200, (page.api_path, twin.text[:300])
        assert isinstance(twin.json(), dict) and twin.json(), page.api_path


def _documented() -> set[str]:
    text = (ROOT / "docs" / "web.md").read_text(encoding="utf-8")
    return {re.split(r"[?#]", code)[0] for code in re.findall(r"`([^`\s]+)`", text)}


def _doc_form(path: str) -> str:
    return re.sub(r"{(\w+)}", lambda m: DOC_NAMES.get(m.group(1), m.group(1).upper()), path)


def test_every_route_is_in_docs_web_md(app):
    documented = _documented()
    missing = sorted(_doc_form(p) for p in _routes(app) if _doc_form(p) not in documented)
    assert missing == [], f"routes not in docs/web.md: {missing}"


def test_the_docs_check_can_fail():
    assert _doc_form("/api/p/{name}/source/{file_id}/lines/{line}") in _documented()
    assert _doc_form("/api/p/{name}/no-such-route") not in _documented()


def test_the_modeled_badge_links_to_the_fidelity_table(app):
    """A user sees how far to trust modeled device times: the badge opens the table
    benchmarks/fidelity.py --write keeps (published measurements beside modeled times)."""
    client = TestClient(app)
    shell = client.get(f"/p/{SAMPLE.name}")
    badge = re.search(r'<a id="modeled-badge"[^>]*href="([^"]+)"', shell.text)
    assert badge is not None
    page = client.get(badge.group(1))
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "<th>published</th>" in page.text and "bert-base" in page.text


# a tab that shows no time of its own: the SQL console's tables are the profile's raw columns
NO_TIMES = {"sql"}


@pytest.mark.parametrize(
    "page",
    [
        p
        for p in PAGES
        if p.shell.tab and p.kind not in NO_TIMES and "{" not in p.path.replace("{name}", "")
    ],  # fmt: skip
    ids=lambda p: p.kind,
)
def test_every_tab_of_a_neuron_capture_shows_the_modeled_badge(app, page):
    """Its twin says the times are modeled (a finding's saving is modeled device time too) and
    its script shows the badge that links to the fidelity table."""
    doc = TestClient(app).get(page.api_path.replace("{name}", SAMPLE.name)).json()
    assert doc.get("device_time_modeled", doc.get("modeled")) is True, page.kind
    script = ROOT / "neuron_explorer" / "web" / "static" / "js" / page.shell.script
    assert "setModeled(" in script.read_text(encoding="utf-8"), page.shell.script
