"""The explorer page's first paint: ``/`` carries the first view inline (web/api.py
``index_page``), exactly what the page's own first requests would answer, so the page draws a
schedule before it has asked for anything (the browser side: tests/test_explore_browser.py)."""

from __future__ import annotations

import json
import re
from importlib import resources
from urllib.parse import parse_qsl

from pipebubble.web import api


def inlined(html: bytes) -> dict:
    m = re.search(rb'<script id="initial" type="application/json">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1).replace(b"<\\/", b"</"))


def test_the_page_inlines_the_first_view_as_the_api_answers_it():
    html = resources.files("pipebubble.web").joinpath("static", "index.html").read_bytes()
    page = api.index_page(html)
    data = inlined(page)
    params = dict(parse_qsl(data["query"]))
    assert params["schedule"] == "gpipe" and params["ranks"] == "4" and params["f"] == "1"
    assert data["simulation"] == json.loads(json.dumps(api.simulate_get(params)))
    assert data["simulation"]["step_time"] == 33.0  # (m + p - 1)(F + B) = 11 x 3
    assert data["sweep"] == json.loads(json.dumps(api.sweep(params)))
    assert data["meta"]["defaults"]["schedule"] == "gpipe"
    # app.js's defaults are the inlined view's (else the page would not use it)
    js = resources.files("pipebubble.web").joinpath("static", "app.js").read_text()
    for name, value in params.items():
        if name != "schedule":
            assert re.search(rf'\["{name}", "[^"]+", [^\]]*, {value}\]', js), name


def test_no_value_can_close_the_script_element(monkeypatch):
    monkeypatch.setattr(api, "initial_view", lambda: {"x": "</script><b>"})
    page = api.index_page(b'<p><script id="initial" type="application/json"></script></p>')
    assert page.count(b"</script>") == 1 and b"<\\/script>" in page
    assert api.index_page(b"<p>no slot</p>") == b"<p>no slot</p>"
