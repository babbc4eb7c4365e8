"""Regenerate docs/chapter.png, the picture in README.md: a rendered chapter with a widget.

Needs a built book (`make book`) and Debian's chromium.
Run: .venv/bin/python scripts/readme_picture.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser import CHROMIUM_ARGS, chromium_path, serve  # noqa: E402

PAGE, WIDGET_INDEX = "book/attention/multi_head_attention.html", 0


def main() -> None:
    with serve(ROOT / "_build" / "html") as base_url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 1500}, device_scale_factor=1)
        page.goto(base_url + PAGE)
        widget = page.locator(".tfw").nth(WIDGET_INDEX)
        widget.wait_for(timeout=30000)
        cell_xpath = "xpath=ancestor::div[contains(concat(' ', @class, ' '), ' cell ')][1]"
        cell = widget.locator(cell_xpath)
        cell.evaluate("(node) => node.scrollIntoView({block: 'end'})")
        box = cell.bounding_box()  # viewport coordinates
        page.mouse.move(box["x"] + 60, box["y"] + box["height"] * 0.5)  # hover a row
        page.wait_for_timeout(200)
        top = max(box["y"] - 120, 0)  # include the text above the widget
        page.screenshot(path=ROOT / "docs" / "chapter.png",
                        clip={"x": box["x"] - 20, "y": top, "width": box["width"] + 40,
                              "height": box["y"] + box["height"] + 10 - top})
        browser.close()


if __name__ == "__main__":
    main()
