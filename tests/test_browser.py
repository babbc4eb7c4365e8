"""The rendered book in a real browser: offline, math typeset, widgets respond without a kernel."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.browser import WIDGET_SNAPSHOT_JS, serve, wait_for_new_snapshot, watch
from tests.conftest import BUILD, TOC

SCREENSHOTS = BUILD / "screenshots"
# Full-page screenshots (to look at) are taken when working on built pages
# (TFBOOK_REUSE_BUILD=1) or when asked for (TFBOOK_SCREENSHOTS=1), and of every page whose
# check fails; a plain run of the whole suite skips the rest (a few seconds a page).
WANT_SCREENSHOTS = any(os.environ.get(name) == "1"
                       for name in ("TFBOOK_SCREENSHOTS", "TFBOOK_REUSE_BUILD"))
PHONE = {"width": 390, "height": 844}  # a phone held upright (CSS pixels)
DESKTOP = {"width": 1280, "height": 900}

# What sticks out to the right of the viewport: every element and text whose right edge is
# beyond it, except inside a box of its own that scrolls or clips sideways (a wide table or
# diagram scrolling in its box is fine; the page's own columns, which hold the article, are
# no such box) and inside fixed boxes (drawers off screen do not widen the page). Each is
# named by its element and a few ancestors, with its right edge in px.
OVERFLOW_JS = r"""(vw) => {
  const article = document.querySelector('article') || document.body;
  const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
    (typeof e.className === 'string' && e.className.trim()
      ? '.' + e.className.trim().split(/\s+/).slice(0, 3).join('.') : '');
  const path = (e) => {
    const parts = [];
    for (let q = e; q && q !== document.body && parts.length < 4; q = q.parentElement) {
      parts.push(name(q));
    }
    return parts.join(' < ');
  };
  const found = [];
  const seen = new Set();
  const note = (e, right, what) => {
    if (seen.has(e) || found.length >= 12) return;
    seen.add(e);
    found.push(`${what}${path(e)} (right edge ${Math.round(right)} px)`);
  };
  const walk = (e) => {
    for (const child of e.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) {
        if (!child.textContent.trim()) continue;
        const range = document.createRange();
        range.selectNodeContents(child);
        const r = range.getBoundingClientRect();
        if (r.width > 0 && r.right > vw + 1) note(e, r.right, 'text in ');
        continue;
      }
      if (child.nodeType !== Node.ELEMENT_NODE) continue;
      const style = getComputedStyle(child);
      if (style.position === 'fixed' || style.display === 'none' ||
          style.visibility === 'hidden') continue;
      const r = child.getBoundingClientRect();
      if (r.width > 0 && r.right > vw + 1) note(child, r.right, '');
      if (['auto', 'scroll', 'hidden', 'clip'].includes(style.overflowX) &&
          !child.contains(article)) continue;
      walk(child);
    }
  };
  walk(document.body);
  // a widget draws inside its column: nothing of it spills into the margin beside it
  for (const w of document.querySelectorAll('.tfw')) {
    if (w.scrollWidth > w.clientWidth + 1) {
      found.push(`widget ${path(w)} draws ${w.scrollWidth} px in its ${w.clientWidth} px box`);
    }
  }
  return {width: document.documentElement.scrollWidth, found};
}"""


def built_pages() -> list[str]:
    """Every page of the book, relative to _build/html: the table of contents' files."""
    pages = ["index.html", "genindex.html", "search.html"]
    for line in TOC.read_text(encoding="utf-8").splitlines():
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key in ("root", "file"):
            pages.append(value.strip() + ".html")
    return pages


@pytest.fixture(scope="module")
def site(book_html: Path):
    with serve(book_html) as base_url:
        yield base_url


def open_page(page, site: str, book_html: Path, page_path: str) -> str:
    """Open `page_path` (following a redirect such as index.html's); returns the HTML of the
    page it shows."""
    source = (book_html / page_path).read_text(encoding="utf-8")
    page.goto(site + page_path, wait_until="load")
    redirect = re.search(r'http-equiv="Refresh" content="0; url=([^"]+)"', source)
    if redirect:
        target = (Path(page_path).parent / redirect.group(1)).as_posix()
        page.wait_for_url(site + target)
        page.wait_for_load_state("load")
        source = (book_html / target).read_text(encoding="utf-8")
    return source


def wait_until_drawn(page, source: str) -> None:
    """Wait (for conditions) until the page has its final layout: math typeset, every widget
    in the page and every canvas it shows painted (sized from its data: a fresh canvas is
    300 x 150), the fonts loaded."""
    if 'class="math' in source:
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0",
                               timeout=60000)
        page.evaluate("() => window.MathJax.startup.promise.then(() => true)")
    n_views = source.count("application/vnd.jupyter.widget-view+json")
    if n_views:
        page.wait_for_function(
            f"""document.querySelectorAll('.tfw').length >= {n_views} &&
            [...document.querySelectorAll('.tfw canvas')].every((c) =>
              c.getClientRects().length === 0 || c.width !== 300 || c.height !== 150)""",
            timeout=60000)
    page.evaluate("document.fonts.ready.then(() => true)")


def assert_fits(page, page_path: str, viewport: dict) -> None:
    """No sideways scrolling: the page is no wider than the viewport, and nothing sticks
    out of it except inside a box that scrolls on its own."""
    width = viewport["width"]
    result = page.evaluate(OVERFLOW_JS, width)
    assert result["width"] <= width + 1 and not result["found"], (
        f"{page_path} at {width} px is {result['width']} px wide; sticking out: "
        + "; ".join(result["found"]))


def snapshot(root) -> str:
    return root.evaluate(WIDGET_SNAPSHOT_JS)


def interact_and_check(page, root, name: str) -> None:
    """A keyboard and a mouse interaction must each change what the widget draws."""
    before = snapshot(root)
    slider = root.locator("input[type=range]").first
    if slider.count():
        slider.focus()
        at_max = slider.evaluate("(s) => Number(s.value) >= Number(s.max)")
        page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
        # fails (times out) if pressing an arrow key on the slider changes nothing
        before = wait_for_new_snapshot(root, before)
    canvas = root.locator("canvas").first
    if canvas.count():
        # the map itself in view (a tall widget may hold it below the fold), and the mouse
        # from the top to the bottom of the part of it the window shows
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        top = max(box["y"], 0)
        bottom = min(box["y"] + box["height"], page.viewport_size["height"])
        page.mouse.move(box["x"] + box["width"] / 2, top + 3)
        first = snapshot(root)
        page.mouse.move(box["x"] + box["width"] / 2, bottom - 3)
        # fails (times out) if moving the mouse over the map changes nothing
        assert wait_for_new_snapshot(root, first) != before, f"{name}: the mouse changed nothing"


def screenshot(page, page_path: str, suffix: str) -> None:
    """The whole page as a PNG in _build/screenshots, named after the page."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # a long page on a loaded machine can take more than Playwright's default 30 s
    page.screenshot(path=SCREENSHOTS / (page_path.replace("/", "__")[:-5] + suffix),
                    full_page=True, timeout=300_000)


@pytest.mark.parametrize("page_path", built_pages())
def test_page_offline_typeset_and_interactive(browser, site: str, book_html: Path,
                                              page_path: str) -> None:
    page = browser.new_page(viewport=DESKTOP)
    log = watch(page, site)
    source = open_page(page, site, book_html, page_path)
    wait_until_drawn(page, source)
    assert_fits(page, page_path, DESKTOP)

    if 'class="math' in source:
        n_math = page.locator(".math").count()
        n_typeset = page.locator(".math mjx-container, mjx-container.MathJax").count()
        assert n_typeset >= n_math, f"{page_path}: {n_math} formulas, {n_typeset} typeset"
        body = page.locator("article").inner_text()
        assert "$$" not in body, f"{page_path}: raw $$ left in the text"

    if 'class="cell' in source:
        # nothing is cut off: every code and output line fits its box (long ones wrap)
        hidden = page.evaluate("[...document.querySelectorAll('div.cell pre')]"
                               ".filter((p) => p.scrollWidth > p.clientWidth + 1).length")
        assert hidden == 0, f"{page_path}: {hidden} code or output blocks are wider than the page"

    if source.count("application/vnd.jupyter.widget-view+json"):
        roots = page.locator(".tfw")
        for i in range(roots.count()):
            root = roots.nth(i)
            root.scroll_into_view_if_needed()
            interact_and_check(page, root, f"{page_path} widget {i}")

    if WANT_SCREENSHOTS:
        screenshot(page, page_path, ".png")
    page.close()
    assert not log.foreign_requests, f"{page_path} asked other hosts: {log.foreign_requests}"
    assert not log.page_errors, f"{page_path} raised in JavaScript: {log.page_errors}"
    assert not log.console_errors, f"{page_path} logged errors: {log.console_errors}"


@pytest.mark.parametrize("page_path", built_pages())
def test_page_fits_a_phone(browser, site: str, book_html: Path, page_path: str) -> None:
    """On a phone (390 px) no page scrolls sideways: wide widgets, diagrams, tables and
    outputs fit the column or scroll inside their own box."""
    page = browser.new_page(viewport=PHONE)
    log = watch(page, site)
    source = open_page(page, site, book_html, page_path)
    wait_until_drawn(page, source)
    try:
        assert_fits(page, page_path, PHONE)
    except AssertionError:
        screenshot(page, page_path, "@390.png")  # to see what sticks out
        raise
    finally:
        if WANT_SCREENSHOTS:
            screenshot(page, page_path, "@390.png")
        page.close()
    assert not log.page_errors, f"{page_path} raised in JavaScript: {log.page_errors}"
