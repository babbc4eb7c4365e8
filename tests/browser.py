"""Helpers of the browser tests: serve a folder on 127.0.0.1 and open it in headless Chromium.

Chromium is Debian's (`apt-get install chromium`), driven by Playwright for Python through
`executable_path`: Playwright's own browser download cannot work on a machine that reaches
only the package registries.
"""

from __future__ import annotations

import functools
import html
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

from tests.modules import load_module

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-quic", "--no-first-run", "--disable-gpu",
]


# Where Chromium or Chrome usually lives when it is not on PATH under a Debian name.
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER_PATHS = (
    "/Applications/Chromium.app/Contents/MacOS/Chromium",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
    "/snap/bin/chromium",
    "/usr/lib/chromium/chromium",
)


def chromium_path() -> str:
    """The browser the tests drive: $CHROMIUM if set, else Chromium or Chrome where they live."""
    named = os.environ.get("CHROMIUM")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise RuntimeError(f"CHROMIUM={named!r} is not an executable file: give the path of "
                               "a Chromium or Chrome executable")
        return named
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    for path in BROWSER_PATHS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise RuntimeError(
        "the browser tests need Chromium or Chrome, which was not found: on Debian/Ubuntu run "
        "`apt-get install chromium` (.ci/run does this when it is missing); elsewhere set "
        "CHROMIUM to the browser's executable, e.g. CHROMIUM=\"/Applications/Google "
        "Chrome.app/Contents/MacOS/Google Chrome\""
    )


if __name__ == "__main__":  # `python -m tests.browser`: print the browser, or why there is none
    import sys

    try:
        print(chromium_path())
    except RuntimeError as error:
        sys.exit(f"error: {error}")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve `folder` on a free port of 127.0.0.1; yields the base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class PageLog:
    """What a page did: console errors, uncaught exceptions, requests to other hosts, dialogs."""

    base_url: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def is_local(self, url: str) -> bool:
        parsed = urlparse(url)
        if parsed.scheme in ("data", "blob", "about"):
            return True
        return url.startswith(self.base_url)


def watch(page, base_url: str) -> PageLog:
    """Record what `page` does, and block (and log) every request to another host."""
    log = PageLog(base_url)
    page.on("console", lambda m: log.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: log.page_errors.append(str(error)))

    def on_dialog(dialog) -> None:
        log.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)

    def route(request_route) -> None:
        url = request_route.request.url
        if log.is_local(url):
            request_route.continue_()
        else:
            log.foreign_requests.append(url)
            request_route.abort()

    page.route("**/*", route)
    return log


WIDGET_SNAPSHOT_JS = """(root) => {
  const parts = [];
  root.querySelectorAll('canvas').forEach((c) => parts.push(c.toDataURL()));
  root.querySelectorAll('svg').forEach((s) => parts.push(s.outerHTML));
  parts.push(root.innerText);
  return parts.join('|');
}"""


SITE_EXTENSION = Path(__file__).resolve().parent.parent / "book" / "_ext" / "tfbook_site.py"


@functools.cache
def site_extension():
    """The book's Sphinx extension (book/_ext/tfbook_site.py), which escapes the widget state."""
    return load_module(SITE_EXTENSION)


def widget_page(widget, assets: Path, folder: Path, name: str = "widget.html") -> Path:
    """Write a standalone page showing `widget` from its saved state, as the book does.

    The page loads the same front-end files as the built book (require.js, the widget
    manager, anywidget), from `assets` copied next to it. The state and the view are escaped
    exactly as in the built book: the state by the book's extension, the view by myst-nb.
    """
    from ipywidgets.embed import dependency_state, embed_data
    from myst_nb.core.render import sanitize_script_content

    # only this widget and the widgets it refers to: by default ipywidgets embeds every widget
    # the process has made, so the page (and its measured size) would depend on earlier tests
    data = embed_data(views=[widget], drop_defaults=False,
                      state=dependency_state([widget], drop_defaults=False))
    if not (folder / "assets").exists():
        shutil.copytree(assets, folder / "assets")
    state = site_extension().escape_widget_state(data["manager_state"])
    view = sanitize_script_content(json.dumps(data["view_specs"][0]))
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(name)}</title>
<script src="assets/require.min.js"></script>
<script src="assets/require-config.js"></script>
<script src="assets/html-manager/embed-amd.js"></script>
<script type="application/vnd.jupyter.widget-state+json">{state}</script>
</head><body>
<script type="application/vnd.jupyter.widget-view+json">{view}</script>
</body></html>"""
    path = folder / name
    path.write_text(page, encoding="utf-8")
    return path


@contextmanager
def static_widget(browser, widget, assets: Path, folder: Path, name: str = "widget.html",
                  viewport: dict | None = None):
    """Open `widget` from its saved state in a new page (as `widget_page` writes it), served
    from `folder`, at `viewport` (Playwright's default when None); yields (page, the widget's
    root element, the PageLog). Closes the page."""
    page_file = widget_page(widget, assets, folder, name)
    with serve(folder) as base_url:
        page = browser.new_page(**({"viewport": viewport} if viewport else {}))
        log = watch(page, base_url)
        page.goto(base_url + page_file.name)
        root = page.locator(".tfw").first
        root.wait_for(timeout=60000)
        try:
            yield page, root, log
        finally:
            page.close()


def wait_for_new_snapshot(root, before: str, timeout: float = 60000) -> str:
    """Wait (for a condition, not a time) until the widget under `root` draws something other
    than the snapshot `before`; returns the new snapshot."""
    root.page.wait_for_function(f"([r, b]) => ({WIDGET_SNAPSHOT_JS})(r) !== b",
                                arg=[root.element_handle(), before], timeout=timeout)
    return root.evaluate(WIDGET_SNAPSHOT_JS)


def wait_for_new_text(locator, before: str, timeout: float = 60000) -> str:
    """Wait until the element's text differs from `before`; returns the new text."""
    locator.page.wait_for_function("([e, t]) => e.innerText !== t",
                                   arg=[locator.element_handle(), before], timeout=timeout)
    return locator.inner_text()


def main_thread_cpu(page) -> Callable[[], float]:
    """A reader of the CPU milliseconds the page's main thread has used so far (Chromium's own
    count: ThreadTime of the DevTools protocol's Performance.getMetrics). The main thread runs
    the widgets' JavaScript, layout and painting. Unlike performance.now(), this count does not
    grow while the thread waits for a core, so a loaded machine hardly stretches it: the
    speed bounds of the browser tests are CPU times taken with it (the difference of two
    readings), the clock times are only printed."""
    session = page.context.new_cdp_session(page)
    session.send("Performance.enable", {"timeDomain": "threadTicks"})

    def read() -> float:
        metrics = session.send("Performance.getMetrics")["metrics"]
        return 1e3 * next(m["value"] for m in metrics if m["name"] == "ThreadTime")

    return read
