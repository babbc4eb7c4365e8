"""A learner's path: JupyterLab opens a .md chapter as a notebook, and its widget is live.

Starts JupyterLab as `make lab` does (with the settings the set-up installs), opens
book/intro.md, waits for its kernel to be idle, runs every cell, and checks that the
positional-encoding explorer found its kernel (the live controls are enabled) and that asking
Python for a new width redraws it. Every step waits for a condition, with time limits meant
for a loaded 2-core machine (the kernel imports torch there in tens of seconds).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Time limits (conditions are polled until then): generous, so that a loaded machine passes.
START_SECONDS = 180  # JupyterLab answers its API
KERNEL_MS = 180_000  # the notebook's kernel has started and is idle
RUN_MS = 300_000  # every cell has run and the widget is drawn
LIVE_MS = 120_000  # the widget found its kernel; Python answered a request

# The notebook's kernel is connected and idle: it can run cells now. (JupyterLab's session
# context is the source of the toolbar's kernel indicator; the indicator alone starts as
# "idle" before any kernel is there.)
KERNEL_IDLE = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const session = panel && panel.sessionContext;
  return Boolean(session && session.isReady && session.session && session.session.kernel &&
                 session.kernelDisplayStatus === "idle");
}"""


def serves(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    port = free_port()
    folder = tmp_path_factory.mktemp("lab")
    log = folder / "lab.log"
    # a copy of the book: nothing the session saves (autosave) can touch the sources
    shutil.copytree(ROOT / "book", folder / "book")
    command = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
               f"--port={port}", "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=",
               "--ServerApp.password=", f"--ServerApp.root_dir={folder / 'book'}",
               "--LabApp.expose_app_in_browser=True", "--allow-root"]
    with open(log, "w") as out:
        lab = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + START_SECONDS
    try:
        while not serves(url + "api/status"):
            if lab.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)  # poll again: the server answers once it is up
        yield url
    finally:
        lab.terminate()
        lab.wait(timeout=30)


def test_chapter_opens_as_notebook_and_widget_is_live(browser, lab_url: str) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(lab_url + "lab/tree/intro.md")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=KERNEL_MS)  # a notebook, not text
    page.wait_for_function(KERNEL_IDLE, timeout=KERNEL_MS)
    page.wait_for_selector(".jp-NotebookPanel-toolbar "
                           ".jp-Notebook-ExecutionIndicator[data-status=idle]", timeout=KERNEL_MS)
    # start the run without waiting on the command (its promise settles when all cells ran)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    widget = page.locator(".tfw").first
    widget.wait_for(timeout=RUN_MS)
    widget.scroll_into_view_if_needed()
    recompute = widget.locator("button", has_text="recompute")
    page.wait_for_function("(b) => !b.disabled", arg=recompute.element_handle(), timeout=LIVE_MS)
    title = widget.locator("div").first
    page.wait_for_function("(t) => t.textContent.includes('x 64 dimensions')",
                           arg=title.element_handle(), timeout=LIVE_MS)
    widget.locator("input[aria-label=d_model]").fill("16")
    recompute.click()
    page.wait_for_function("(t) => t.textContent.includes('x 16 dimensions')",
                           arg=title.element_handle(), timeout=LIVE_MS)
    page.evaluate("window.jupyterapp.commands.execute('kernelmenu:shutdown')")
    page.close()
