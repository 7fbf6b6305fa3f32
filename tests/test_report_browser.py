"""The report of the shared run (conftest.small_workflow) as a reviewer opens it: `snakemake --report
report.zip`, unzipped, `report/report.html` in headless Chromium (tests/browser/cdp.py, its DevTools
protocol over a pipe) at 1400x1000. The landing page starts at its heading (and at 1920x1080 and
1400x2000), the run's digest lies whole inside its box, every table page shows all its rows within
its frame, no plot is cut, and nothing is logged as an error.

Skipped where no Chromium is installed (Debian: apt-get install chromium). Screenshots of the landing
page, the scores table page and the scores plot at 1400x1000 are written to the folder the first test
prints (a pytest temporary folder).

Without profiles/default/report.css (the profile's `report-stylesheet` key commented out), the landing
page's heading lies above the window, out of reach, and the first two tests fail.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from conftest import snakemake
from encoder_study.core.results import RESULTS
from encoder_study.report.html import parse_markdown_table

sys.path.insert(0, str(Path(__file__).parent / "browser"))
import cdp  # noqa: E402

pytestmark = pytest.mark.skipif(cdp.unavailable() is not None, reason=str(cdp.unavailable()))

HEADING = "The encoder study: this run"
SIZES = ((1400, 1000), (1920, 1080), (1400, 2000))
SCREENSHOT_TABLE = "results/report/tagging/scores.html"
SCREENSHOT_PLOT = "results/tagging/scores.png"

# In the page: the main pane (Snakemake's ContentDisplay, the scrolling element beside the menu).
PANE = "document.querySelector('#app > div > div.overflow-auto')"

LANDING = f"""(() => {{
  const h = [...document.querySelectorAll('h1')].find(e => e.textContent.includes({HEADING!r}));
  if (!h) return null;
  const pane = {PANE}, p = pane.getBoundingClientRect(), r = h.getBoundingClientRect();
  return {{top: r.top, bottom: r.bottom, left: r.left, paneTop: p.top, paneLeft: p.left,
           scrollTop: pane.scrollTop, height: innerHeight}};
}})()"""

# Each literal block and paragraph of the landing page: does it hold its text (no sideways scrolling or
# overflow), and is it inside the pane's width? The digest: each line box of its text inside the block.
BLOCKS = f"""(() => {{
  const pane = {PANE}, right = pane.getBoundingClientRect().left + pane.clientWidth + 0.5;
  const blocks = [...document.querySelectorAll('.prose pre, .prose p')].map(b => ({{
    text: b.textContent.slice(0, 60), overflow: b.scrollWidth - b.clientWidth,
    right: b.getBoundingClientRect().right - right}}));
  const pre = [...document.querySelectorAll('.prose pre')].find(b => b.textContent.includes('run digest'));
  if (!pre) return {{blocks, digest: null}};
  const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
  let node, at = -1;
  while ((node = walker.nextNode()) && (at = node.data.search(/[0-9a-f]{{64}}/)) < 0) {{}}
  if (!node) return {{blocks, digest: null}};
  const range = document.createRange();
  range.setStart(node, at);
  range.setEnd(node, at + 64);
  const box = pre.getBoundingClientRect();
  const outside = [...range.getClientRects()].filter(r => r.left < box.left - 0.5 || r.right > box.right + 0.5
    || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5).length;
  return {{blocks, digest: node.data.substr(at, 64), outside,
           preOverflow: pre.scrollWidth - pre.clientWidth}};
}})()"""


def show(kind: str, path: str) -> str:
    """Show one result as its menu entry does (components/result_view_button.js), from the top."""
    return (f"app.setView({{content: {kind!r}, contentPath: results[{path!r}].data_uri,"
            f" resultPath: {path!r}}}); {PANE}.scrollTo(0, 0); true")


TABLE = f"""(() => {{
  const frame = {PANE}.querySelector('iframe');
  const doc = frame && frame.contentDocument;
  if (!doc || doc.readyState !== 'complete' || !doc.location.href.endsWith(%s)) return null;
  return {{rows: doc.querySelectorAll('tbody tr').length, width: doc.documentElement.scrollWidth,
           frame: frame.clientWidth}};
}})()"""

PLOT = f"""(() => {{
  const pane = {PANE}, img = pane.querySelector('img');
  if (!img || !img.complete || !img.getAttribute('src').endsWith(%s)) return null;
  pane.scrollTo(0, 0);
  const p = pane.getBoundingClientRect(), r = img.getBoundingClientRect();
  return {{natural: img.naturalWidth, top: r.top - p.top, left: r.left - p.left,
           right: r.right - (p.left + pane.clientWidth), height: r.height}};
}})()"""


@pytest.fixture(scope="module")
def seen(small_workflow, tmp_path_factory) -> dict:
    """What Chromium shows of the shared run's report: measurements, errors and screenshots."""
    folder = tmp_path_factory.mktemp("report-browser")
    done = snakemake("--report", str(folder / "report.zip"), cwd=small_workflow)
    assert done.returncode == 0, done.stdout + done.stderr
    with zipfile.ZipFile(folder / "report.zip") as archive:
        archive.extractall(folder)
    url = (folder / "report" / "report.html").as_uri()
    shots = folder / "screenshots"
    shots.mkdir()
    found: dict = {"workflow": small_workflow, "landing": {}, "tables": {}, "plots": {}}
    with cdp.Chromium(folder) as browser:
        page = browser.page(*SIZES[0])
        page.open(url)
        assert page.until(f"{PANE} !== null && {PANE}.querySelector('h1.title') !== null"), "no landing page"
        for width, height in SIZES:
            page.resize(width, height)
            found["landing"][width, height] = page.evaluate(LANDING)
            if (width, height) == SIZES[0]:
                page.screenshot(shots / "landing-1400x1000.png")
                found["blocks"] = page.evaluate(BLOCKS)
        page.resize(*SIZES[0])
        paths = page.evaluate("Object.keys(results).map(p => [p, getResultMimeType(p), results[p].data_uri])")
        for path, mime, uri in paths:
            if mime == "text/html":
                page.evaluate(show("html", path))
                found["tables"][path] = page.until(TABLE % repr(uri))
                if path == SCREENSHOT_TABLE:
                    page.screenshot(shots / "table-tagging-scores-1400x1000.png")
            elif mime.startswith("image/"):
                page.evaluate(show("img", path))
                found["plots"][path] = page.until(PLOT % repr(uri))
                if path == SCREENSHOT_PLOT:
                    page.screenshot(shots / "plot-tagging-scores-1400x1000.png")
        found["errors"] = browser.errors
    print(f"screenshots: {shots}")
    return found


def test_landing_page_starts_at_its_heading(seen):
    for size, at in seen["landing"].items():
        assert at is not None, f"{size}: no heading {HEADING!r} on the landing page"
        # At the top of the pane, unscrolled, whole, and not cut at the left.
        assert at["scrollTop"] == 0 and at["paneTop"] <= at["top"] < 200 and at["bottom"] <= at["height"], \
            f"{size}: the heading is not at the top of the window: {at}"
        assert at["left"] >= at["paneLeft"], f"{size}: the heading is cut at the left: {at}"


def test_landing_page_shows_the_digest_and_every_block_whole(seen):
    blocks = seen["blocks"]
    assert blocks["digest"], "no run digest on the landing page"
    assert blocks["outside"] == 0 and blocks["preOverflow"] <= 0, f"the digest is cut in its box: {blocks}"
    cut = [b for b in blocks["blocks"] if b["overflow"] > 0 or b["right"] > 0]
    assert not cut, f"blocks wider than their box or the pane: {cut}"


def test_every_table_page_shows_its_rows_within_its_frame(seen):
    expected = {entry.html: entry.markdown for entry in RESULTS.values() if entry.title}
    assert SCREENSHOT_TABLE in seen["tables"] and len(seen["tables"]) >= 10, sorted(seen["tables"])
    for path, table in seen["tables"].items():
        assert table is not None, f"{path}: the page did not load in its frame"
        assert table["rows"] > 0, f"{path}: no rows"
        if path in expected:  # a table page: every row of its Markdown table
            markdown = (seen["workflow"] / expected[path]).read_text(encoding="utf-8")
            rows = len(parse_markdown_table(markdown, expected[path])[2])
            assert table["rows"] == rows, f"{path}: {table['rows']} rows shown of {rows}"
        assert table["width"] <= table["frame"], \
            f"{path}: {table['width']} px wide in a {table['frame']} px frame (cut at the right)"


def test_no_plot_is_cut(seen):
    assert SCREENSHOT_PLOT in seen["plots"], sorted(seen["plots"])
    for path, plot in seen["plots"].items():
        assert plot is not None and plot["natural"] > 0, f"{path}: the plot did not load"
        assert plot["top"] >= 0 and plot["left"] >= 0, f"{path}: cut at the top or left: {plot}"
        assert plot["right"] <= 0.5, f"{path}: wider than the pane: {plot}"


def test_the_console_has_no_errors(seen):
    assert seen["errors"] == []
