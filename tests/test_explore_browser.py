"""The explorer's page in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Skipped, with the reason shown, when Playwright or the browser is missing; ``.ci/run``
installs both so CI always runs these. The browser starts with a fresh empty profile and no
network services (no sync, no component updates, no QUIC): the page must need nothing but
the local server.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import pytest

from pipebubble.interop.torch_csv import to_torch_csv
from pipebubble.schedules import get_schedule

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="browser tests need Playwright: pip install -c constraints.txt -e '.[dev]'")
CHROMIUM = os.environ.get("PIPEBUBBLE_CHROMIUM") or shutil.which("chromium") or shutil.which(
    "chromium-browser")
if CHROMIUM is None:
    pytest.skip("browser tests need Debian's chromium (apt-get install -y chromium; .ci/run "
                "installs it)", allow_module_level=True)

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser_page():
    from pipebubble.web.server import make_server, url_of

    server = make_server("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with sync_api.sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=ARGS, headless=True,
            viewport={"width": 1300, "height": 1000}, accept_downloads=True)
        page = context.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(url_of(server))
        wait_ready(page)
        yield page, problems, url_of(server)
        context.close()
    server.shutdown()
    server.server_close()


def wait_ready(page, renders_before: int | None = None, seconds: float = 30) -> None:
    """Wait until the page has drawn an answer newer than ``renders_before``."""
    page.wait_for_function(
        "n => document.body.dataset.state === 'ready' && Number(document.body.dataset.renders)"
        " > n", arg=-1 if renders_before is None else renders_before, timeout=seconds * 1000)


def renders(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.renders || 0)"))


def set_value(page, selector: str, value: str) -> None:
    before = renders(page)
    page.fill(selector, value)
    wait_ready(page, before)


@pytest.fixture
def page(browser_page):
    page, problems, url = browser_page
    page.goto(url)  # a fresh default view: the view lives in the address's #fragment
    wait_ready(page)
    problems.clear()
    yield page
    assert problems == [], f"the page logged errors: {problems}"


def test_default_view_is_gpipe_4_8_with_27_27(page):
    assert page.input_value("#schedule") == "gpipe"
    assert page.input_value("#ranks") == "4" and page.input_value("#microbatches") == "8"
    assert page.text_content("#bubble") == "27.27 %"
    assert page.text_content("#closed-form") == "27.27 %"
    assert page.text_content("#step-time") == "33"
    assert "(p−1)/(m+p−1)" in page.text_content("#formula")
    # 4 ranks x 8 microbatches x (F, B) boxes, each with a hover title
    assert page.locator(".gantt .action").count() == 64


def test_moving_m_to_64_shows_4_48(page):
    set_value(page, "#microbatches", "64")
    assert page.text_content("#bubble") == "4.48 %"
    assert page.locator(".gantt .action").count() == 4 * 64 * 2


def test_the_slider_drives_the_same_input(page):
    before = renders(page)
    page.locator("#microbatches-slider").fill("16")  # a range input takes fill() as a value
    wait_ready(page, before)
    assert page.input_value("#microbatches") == "16"
    assert page.text_content("#bubble") == "15.79 %"  # 3/19


def test_switching_to_1f1b_changes_chart_and_peak_memory(page):
    chart = page.inner_html(".gantt")
    assert page.text_content("#peak-memory") == "8 · 8 · 8 · 8"
    before = renders(page)
    page.select_option("#schedule", "1f1b")
    wait_ready(page, before)
    assert page.inner_html(".gantt") != chart
    assert page.text_content("#peak-memory") == "4 · 3 · 2 · 1"
    assert page.text_content("#bubble") == "27.27 %"  # same bubble, bounded memory


def test_boxes_have_the_png_colours_and_hover_titles(page):
    from pipebubble.render.style import kind_color

    first = page.locator(".gantt .action").first
    title = first.locator("title").text_content()
    assert title.startswith("0F0: rank 0, stage 0, forward, microbatch 0, start 0, end 1")
    rgb = ",".join(str(round(255 * c)) for c in kind_color("F"))
    assert first.locator("rect").get_attribute("fill") == f"rgb({rgb})"
    backward = page.locator(".gantt .action", has_text="").filter(
        has=page.locator("title", has_text="0B0:")).first
    rgb = ",".join(str(round(255 * c)) for c in kind_color("B"))
    assert backward.locator("rect").get_attribute("fill") == f"rgb({rgb})"


def test_memory_limit_marks_the_ranks_over_it(page):
    set_value(page, "#memory_limit", "6")
    text = page.text_content(".panel .fits")
    assert text == "does not fit the memory limit 6 on rank(s) 0, 1, 2, 3"
    before = renders(page)
    page.select_option("#schedule", "1f1b")
    wait_ready(page, before)
    assert page.text_content(".panel .fits") == "fits the memory limit 6 on every rank"


def test_compare_mode_shows_schedules_side_by_side(page):
    for name in ("1f1b", "zb-h1"):
        before = renders(page)
        page.check(f".compare[value='{name}']")
        wait_ready(page, before)
    names = page.eval_on_selector_all(".panel", "ps => ps.map(p => p.dataset.name)")
    assert names == ["gpipe", "1f1b", "zb-h1"]
    bubbles = page.eval_on_selector_all(".panel .bubble", "bs => bs.map(b => b.textContent)")
    assert bubbles[:2] == ["27.27 %", "27.27 %"]
    assert bubbles[2] != "27.27 %"  # ZB-H1: (p-1)(F+I-W) = 3 units of bubble, not 9
    assert page.locator("#sweep-svg path").count() >= 3


def test_loading_a_csv_shows_it(page):
    text = to_torch_csv(get_schedule("1f1b", 4, 8))
    before = renders(page)
    page.set_input_files("#file", files=[{"name": "mine.csv", "mimeType": "text/csv",
                                          "buffer": text.encode()}])
    wait_ready(page, before)
    panel = page.locator(".panel[data-name='mine.csv']")
    assert panel.count() == 1
    assert panel.locator(".bubble").text_content() == "27.27 %"
    assert panel.locator(".peak").text_content() == "4 · 3 · 2 · 1"
    assert panel.locator(".gantt .action").count() == 64


def test_downloads_svg_png_and_csv(page, tmp_path):
    with page.expect_download() as svg:
        page.click("#download-svg")
    body = (tmp_path / "v.svg")
    svg.value.save_as(body)
    assert body.read_text().startswith("<svg xmlns=\"http://www.w3.org/2000/svg\"")
    assert "0F0: rank 0" in body.read_text()
    with page.expect_download() as png:
        page.click("#download-png")
    png.value.save_as(tmp_path / "v.png")
    assert (tmp_path / "v.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with page.expect_download() as csv:
        page.click("#download-csv")
    csv.value.save_as(tmp_path / "g.csv")
    assert (tmp_path / "g.csv").read_text() == to_torch_csv(get_schedule("gpipe", 4, 8))


def test_bad_input_shows_the_servers_message(browser_page):
    page, problems, url = browser_page
    page.goto(url)
    wait_ready(page)
    set_value(page, "#w", "3")
    assert "w must be <= b" in page.text_content("#error")
    # the browser itself reports the 400 answer on its console; nothing else may be there
    assert all("400" in p for p in problems), problems
    problems.clear()


def test_loading_a_measured_run_shows_measured_and_predicted(page):
    import json

    from pipebubble.costs import CostModel
    from pipebubble.interop.timeline_json import simulate_json

    run = simulate_json(get_schedule("gpipe", 2, 2), CostModel(f=0.001, b=0.002, w=0.001))
    run.update(source="measured", predicted={"step_time": 0.008, "bubble_fraction": 0.25})
    before = renders(page)
    page.set_input_files("#file", files=[{"name": "run.json", "mimeType": "application/json",
                                          "buffer": json.dumps(run).encode()}])
    wait_ready(page, before)
    panel = page.locator(".panel[data-name='run.json']")
    assert "(measured)" in panel.locator("h3").text_content()
    assert "step time 0.009 s" in panel.locator(".stats").text_content()  # (2+2-1)(1+2) ms
    rows = panel.locator("table.predicted tr").all_text_contents()
    assert rows[1:] == ["step time0.0090.008", "bubble33.33 %25.00 %"]
    predicted = page.locator(".panel[data-name='run.json · predicted']")
    assert "step time 0.009 s" in predicted.locator(".stats").text_content()
    assert predicted.locator(".gantt .action").count() == 8


def test_a_file_over_the_limit_is_refused_in_the_page(page):
    from pipebubble.web.api import MAX_BODY_BYTES

    before = renders(page)
    page.set_input_files("#file", files=[{"name": "big.csv", "mimeType": "text/csv",
                                          "buffer": b"0F0," * (MAX_BODY_BYTES // 4 + 1)}])
    wait_ready(page, before)
    panel = page.locator(".panel[data-name='big.csv']")
    assert "the explorer takes files of at most" in panel.text_content()
    assert page.text_content("#bubble") == "27.27 %"  # the simulation is still there


def test_span_published_forms_show_the_span_bubble(page):
    """ZB-V publishes 0 bubble within each rank's span (F = I = W): the page shows the span
    bubble beside it, not only the step's (which includes warm-up and cool-down)."""
    assert (page.input_value("#f"), page.input_value("#b"), page.input_value("#w")) == (
        "1", "2", "1")  # F = 1, I = B - W = 1, W = 1
    before = renders(page)
    page.select_option("#schedule", "zbv")
    wait_ready(page, before)
    assert page.text_content("#closed-form") == "0.00 %"
    assert page.text_content("#basis").endswith("idles 0.00 %")
    assert page.text_content("#bubble") != "0.00 %"


def key_items(page) -> list[tuple[str, str]]:
    """(data-kind, swatch colour) of every entry of the colour key, in order."""
    return page.eval_on_selector_all(
        "#legend .key", "ks => ks.map(k => [k.dataset.kind, "
        "k.querySelector('.swatch').style.background])")


def test_the_colour_key_names_what_is_drawn_in_its_colours(page):
    from pipebubble.render.style import IDLE_COLOR, kind_color

    def rgb(kind, chunk=0, chunks=1):
        return "rgb(" + ", ".join(str(round(255 * c)) for c in kind_color(kind, chunk, chunks)) \
            + ")"

    items = key_items(page)  # gpipe: F and B only
    assert [k for k, _ in items] == ["F", "B", "idle", "memory"]
    assert dict(items)["F"] == rgb("F") and dict(items)["B"] == rgb("B")
    idle = tuple(int(IDLE_COLOR[i:i + 2], 16) for i in (1, 3, 5))
    assert dict(items)["idle"] == "rgb({}, {}, {})".format(*idle)
    assert "F: forward" in page.text_content("#legend")
    # the key's colours are the Gantt chart's: a B box is filled with the key's B colour
    box = page.locator(".gantt .action").filter(has=page.locator("title", has_text="0B0:"))
    assert box.first.locator("rect").get_attribute("fill").replace(",", ", ") == rgb("B")
    before = renders(page)
    page.select_option("#schedule", "zbv")  # split backward, two chunks per rank
    wait_ready(page, before)
    items = dict(key_items(page))
    assert list(items) == ["F", "I", "W", "idle", "chunk", "memory"]
    assert items["chunk"] == rgb("F", 1, 2)  # a later chunk is drawn darker
    set_value(page, "#memory_limit", "3")
    assert "limit" in dict(key_items(page))


def test_the_first_paint_shows_a_schedule_without_any_request(browser_page):
    """The page draws the default view from what the server inlined: with every /api
    request held unanswered, the Gantt chart, the numbers and the key are there."""
    page, _, url = browser_page
    fresh = page.context.new_page()
    held = []
    fresh.route("**/api/**", lambda route: held.append(route))  # never answered
    try:
        fresh.goto(url, wait_until="load")
        fresh.wait_for_selector(".gantt .action", timeout=30_000)
        assert fresh.evaluate("document.body.dataset.firstPaint") == "inline"
        assert fresh.locator(".gantt .action").count() == 64  # gpipe 4 x 8, F and B
        assert fresh.text_content("#bubble") == "27.27 %"
        assert fresh.text_content("#step-time") == "33"
        assert [k for k, _ in key_items(fresh)] == ["F", "B", "idle", "memory"]
        assert fresh.locator("#sweep-svg circle").count() > 0
        assert held  # the page did ask (its usual update), and drew before any answer
    finally:
        fresh.close()  # the held requests go with the page


def test_the_view_is_kept_in_the_address(page):
    set_value(page, "#microbatches", "64")
    before = renders(page)
    page.check(".compare[value='1f1b']")
    wait_ready(page, before)
    assert "microbatches=64" in page.url and "compare=1f1b" in page.url
    page.reload()
    wait_ready(page)
    assert page.input_value("#microbatches") == "64"
    assert page.text_content("#bubble") == "4.48 %"
    assert page.is_checked(".compare[value='1f1b']")


def test_auto_searches_under_the_memory_limit(page):
    set_value(page, "#memory_limit", "3")
    before = renders(page)
    page.select_option("#schedule", "auto")
    wait_ready(page, before, seconds=120)  # a search and a sweep of 12 (about 6 s of CPU)
    assert page.input_value("#chunks") == ""  # the search picks the placement
    peaks = [float(x) for x in page.text_content("#peak-memory").split(" · ")]
    assert max(peaks) <= 3
    assert page.text_content(".panel .fits") == "fits the memory limit 3 on every rank"
