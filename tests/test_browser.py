"""The rendered book in a real browser: offline, math typeset, widgets respond without a kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import WIDGET_SNAPSHOT_JS, serve, wait_for_new_snapshot, watch
from tests.conftest import BUILD, TOC

SCREENSHOTS = BUILD / "screenshots"


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
        box = canvas.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 3)
        first = snapshot(root)
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] - 3)
        # fails (times out) if moving the mouse over the map changes nothing
        assert wait_for_new_snapshot(root, first) != before, f"{name}: the mouse changed nothing"


@pytest.mark.parametrize("page_path", built_pages())
def test_page_offline_typeset_and_interactive(browser, site: str, book_html: Path,
                                              page_path: str) -> None:
    source = (book_html / page_path).read_text(encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    log = watch(page, site)
    page.goto(site + page_path, wait_until="load")

    if 'class="math' in source:
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0",
                               timeout=20000)
        n_math = page.locator(".math").count()
        n_typeset = page.locator(".math mjx-container, mjx-container.MathJax").count()
        assert n_typeset >= n_math, f"{page_path}: {n_math} formulas, {n_typeset} typeset"
        body = page.locator("article").inner_text()
        assert "$$" not in body, f"{page_path}: raw $$ left in the text"

    if 'class="cell' in source:  # (not index.html, a redirect that replaces the page)
        # nothing is cut off: every code and output line fits its box (long ones wrap)
        hidden = page.evaluate("[...document.querySelectorAll('div.cell pre')]"
                               ".filter((p) => p.scrollWidth > p.clientWidth + 1).length")
        assert hidden == 0, f"{page_path}: {hidden} code or output blocks are wider than the page"

    n_views = source.count("application/vnd.jupyter.widget-view+json")
    if n_views:
        page.wait_for_function(f"document.querySelectorAll('.tfw').length >= {n_views}",
                               timeout=30000)
        roots = page.locator(".tfw")
        for i in range(roots.count()):
            root = roots.nth(i)
            root.scroll_into_view_if_needed()
            interact_and_check(page, root, f"{page_path} widget {i}")

    page.wait_for_load_state("load")  # index.html redirects: let the page it opens settle
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / (page_path.replace("/", "__")[:-5] + ".png"),
                    full_page=True)
    page.close()
    assert not log.foreign_requests, f"{page_path} asked other hosts: {log.foreign_requests}"
    assert not log.page_errors, f"{page_path} raised in JavaScript: {log.page_errors}"
    assert not log.console_errors, f"{page_path} logged errors: {log.console_errors}"
