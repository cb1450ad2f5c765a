"""The README's picture of the explorer (``docs/img/explore.png``), taken by headless Chromium.

    python examples/explore_screenshot.py [OUT]     # default docs/img/explore.png

Starts the explorer's server on a free loopback port, opens the page in Debian's
``chromium`` through Playwright (a fresh empty profile, no network services), ticks
"compare with 1f1b" and "zb-h1" beside the lesson's default (GPipe, p=4, m=8) and saves a
screenshot of the whole page.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

from pipebubble.web.server import make_server, url_of

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main(out: str = "docs/img/explore.png") -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Debian's chromium: apt-get install -y chromium")
    server = make_server("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=chromium, args=ARGS, headless=True,
            viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(url_of(server))
        page.wait_for_selector("body[data-state=ready]")
        for name in ("1f1b", "zb-h1"):
            n = page.evaluate("Number(document.body.dataset.renders)")
            page.check(f".compare[value='{name}']")
            page.wait_for_function("n => Number(document.body.dataset.renders) > n", arg=n)
        page.screenshot(path=out, full_page=True)
        context.close()
    server.shutdown()
    print(f"wrote {Path(out)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
