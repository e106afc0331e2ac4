"""The docs site as a reader sees it: built with `mkdocs build --strict`, served on localhost and opened in
headless Chromium at 1280 px. On the home page and every results page, no table or code block may need a
horizontal scroll bar or run past the content column, and every image must load. The home page shows the
headline chart at a width where its smallest text is at least 9 px; the interactive chart draws every point
of every panel and arm of its data; neither page logs a console error.

Needs Chromium (`apt-get install chromium`: /usr/bin/chromium, or the path in LRA_JAX_CHROMIUM) and
Playwright for Python (the `[site]` extra, in `[test]`), which drives that Chromium: no browser download.
Skips, saying which is missing, without them. Each page's full-page screenshot is saved under the test's
temporary directory, or under LRA_JAX_SCREENSHOTS=<dir> to look at them.
"""

import functools
import glob
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest
from helpers import REPO

CHROMIUM = os.environ.get("LRA_JAX_CHROMIUM", "/usr/bin/chromium")
WIDTH = 1280
# Headless, and nothing that reaches outside the host: the pages' requests for the theme's web fonts are
# refused too, so the page is set in the system's sans-serif and the test never depends on the network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:
    sync_playwright = None

MISSING = ('Playwright for Python is not installed (pip install -e ".[site]")' if sync_playwright is None else
           f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or set LRA_JAX_CHROMIUM)"
           if not os.path.exists(CHROMIUM) else None)
# Anyone's own `pytest` skips the browser test without a browser; CI (CI=true, where .ci/run installs
# Chromium) fails instead, so that a CI that passes has opened the pages.
IN_CI = os.environ.get("CI") == "true"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.one_stack("oldest"),  # what the site looks like does not depend on the jax version
    pytest.mark.skipif(MISSING is not None and not IN_CI, reason=str(MISSING)),
]


@pytest.fixture(scope="module", autouse=True)
def browser_in_ci():  # before the module's other fixtures: the site is not built for nothing
    if MISSING is not None:
        pytest.fail(f"CI opens the site in a browser, and cannot: {MISSING}")

# Per page: each table's hidden width (its scroll width against its box and its wrappers') and how far it
# runs past the content column's right edge, each code block's hidden width (a command or a text table cut
# off behind a scroll bar), whether each image loaded, and the page's own horizontal overflow.
MEASURE = r"""() => {
  const content = document.querySelector('.md-content__inner');
  const right = content.getBoundingClientRect().right;
  const tables = [...content.querySelectorAll('table')].map((table, i) => {
    const boxes = [table, table.closest('.md-typeset__table'), table.closest('.md-typeset__scrollwrap')]
      .filter(Boolean);
    const heading = [...content.querySelectorAll('h1, h2, h3')]
      .filter(h => h.compareDocumentPosition(table) & Node.DOCUMENT_POSITION_FOLLOWING).pop();
    return {index: i, under: heading ? heading.textContent.replace('¶', '').trim() : '',
            columns: table.rows[0] ? table.rows[0].cells.length : 0,
            overflow: Math.max(...boxes.map(b => b.scrollWidth - b.clientWidth)),
            past_content: table.getBoundingClientRect().right - right};
  });
  const code = [...content.querySelectorAll('pre > code')].map(block => ({
    first_line: block.textContent.trim().split('\n')[0], overflow: block.scrollWidth - block.clientWidth}));
  const images = [...content.querySelectorAll('img')].map(img => ({
    src: img.getAttribute('src'), loaded: img.complete && img.naturalWidth > 0}));
  return {tables, code, images, page_overflow: document.documentElement.scrollWidth - window.innerWidth};
}"""


def results_pages() -> list[str]:
    return sorted(os.path.relpath(p, os.path.join(REPO, "docs")) for p in
                  glob.glob(os.path.join(REPO, "docs", "results", "*.md")))


PAGES = ["index.md", *results_pages()]


def url_path(page: str) -> str:
    """docs/<page>.md -> its address on the built site (mkdocs' directory URLs)."""
    stem = page.removesuffix(".md")
    if stem == "index" or stem.endswith("/index"):
        return stem.removesuffix("index")
    return stem + "/"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built strictly into a temporary directory, served on localhost; yields its base URL."""
    out = tmp_path_factory.mktemp("site")
    mkdocs = shutil.which("mkdocs") or os.path.join(os.path.dirname(sys.executable), "mkdocs")
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(out)], cwd=REPO, capture_output=True,
                            text=True, timeout=180, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def handle(self):
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):  # a tab closed while a file was on its way
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    kept = os.environ.get("LRA_JAX_SCREENSHOTS")
    if kept:
        os.makedirs(kept, exist_ok=True)
        return pathlib.Path(kept)
    return tmp_path_factory.mktemp("screenshots")


def render(browser, base: str, page: str, shots) -> dict:
    """Opens `page` of the site at WIDTH px (outside requests refused), screenshots it and measures it."""
    tab = browser.new_page(viewport={"width": WIDTH, "height": 900})
    try:
        tab.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
        response = tab.goto(base + url_path(page), wait_until="load")
        assert response is not None and response.ok, f"{page}: HTTP {response and response.status}"
        tab.screenshot(path=str(shots / (page.replace("/", "_").removesuffix(".md") + ".png")), full_page=True)
        return tab.evaluate(MEASURE)
    finally:
        tab.close()


MANIFEST = os.path.join(REPO, "experiments", "charts", "lra_chart.inputs.json")
INTERACTIVE = os.path.join(REPO, "experiments", "charts", "lra_interactive.json")
READABLE_PX = 9.0


def console_errors(tab, base: str) -> list[str]:
    """Collects the page's console errors and uncaught exceptions, from now on (a request the test itself
    refused, outside the site, is not the page's error)."""
    errors = []

    def on_console(message):
        if message.type == "error" and (message.location or {}).get("url", base).startswith(base):
            errors.append(message.text)

    tab.on("console", on_console)
    tab.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def open_page(browser, base: str, page: str):
    tab = browser.new_page(viewport={"width": WIDTH, "height": 900})
    tab.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
    errors = console_errors(tab, base)
    response = tab.goto(base + url_path(page), wait_until="load")
    assert response is not None and response.ok, f"{page}: HTTP {response and response.status}"
    return tab, errors


def test_the_headline_chart_is_shown_where_its_smallest_text_reads(site, browser):
    with open(MANIFEST, encoding="utf-8") as f:
        headline = json.load(f)["panels"][0]
    assert headline["figure"] == "lra_chart"
    tab, errors = open_page(browser, site, "index.md")
    try:
        shown = tab.evaluate("""() => [...document.querySelectorAll('.md-content img')]
            .filter(img => img.getAttribute('src').endsWith('lra_chart.png'))
            .map(img => ({natural: img.naturalWidth, rendered: img.getBoundingClientRect().width}))""")
    finally:
        tab.close()
    assert shown, "the home page does not show assets/lra_chart.png"
    image = shown[0]
    assert image["natural"] == headline["width_px"], image
    smallest = headline["smallest_text_px"] * image["rendered"] / image["natural"]
    assert smallest >= READABLE_PX, (f"the headline chart is shown {image['rendered']:.0f} px wide of its "
                                     f"{image['natural']} px: its smallest text is {smallest:.1f} px")
    assert errors == [], errors


def test_the_interactive_chart_draws_every_point_of_every_panel_and_arm(site, browser):
    with open(INTERACTIVE, encoding="utf-8") as f:
        document = json.load(f)
    tab, errors = open_page(browser, site, "results/interactive.md")
    try:
        tab.wait_for_selector("#lra-interactive .scatterlayer .point", timeout=30_000)
        drawn = {}
        for i, panel in enumerate(document["panels"]):
            for arm in document["arms"]:
                tab.select_option("#lra-panel", str(i))
                tab.select_option("#lra-arm", arm)
                tab.wait_for_function("([n]) => document.getElementById('lra-interactive').dataset.points === n",
                                      arg=[str(sum(p["arm"] == arm or (p["arm"] == "LRA paper" and
                                                                        arm == document["arms"][0])
                                                   for p in panel["points"]))])
                drawn[(panel["name"], arm)] = tab.evaluate(
                    "() => document.querySelectorAll('#lra-interactive .scatterlayer .point').length")
    finally:
        tab.close()
    expected = {(panel["name"], arm): sum(p["arm"] == arm or (p["arm"] == "LRA paper" and arm == document["arms"][0])
                                          for p in panel["points"])
                for panel in document["panels"] for arm in document["arms"]}
    assert drawn == expected
    assert sum(expected.values()) == sum(len(panel["points"]) for panel in document["panels"])  # every point once
    assert errors == [], errors


def test_the_pages_checked_are_found():
    assert "index.md" in PAGES and "results/lra.md" in PAGES and len(PAGES) >= 4, PAGES


@pytest.mark.parametrize("page", PAGES)
def test_tables_fit_and_images_load_at_1280_px(site, browser, shots, page):
    found = render(browser, site, page, shots)
    wide = [f"table {t['index'] + 1} ({t['columns']} columns, under '{t['under']}'): {t['overflow']} px hidden "
            f"behind a scroll bar, {max(t['past_content'], 0):.0f} px past the content column"
            for t in found["tables"] if t["overflow"] > 1 or t["past_content"] > 1]
    wide += [f"code block '{c['first_line'][:60]}': {c['overflow']} px hidden behind a scroll bar"
             for c in found["code"] if c["overflow"] > 1]
    broken = [i["src"] for i in found["images"] if not i["loaded"]]
    assert not wide, f"{page} at {WIDTH} px:\n" + "\n".join(wide)
    assert not broken, f"{page}: images that did not load: {broken}"
    assert found["page_overflow"] <= 1, f"{page}: the page itself is {found['page_overflow']} px wider than {WIDTH}"
    if page == "index.md":
        assert found["images"], "the home page shows no image (the chart)"
