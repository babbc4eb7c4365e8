"""A learner's path: JupyterLab opens a .md chapter as a notebook, and its widget is live.

Starts JupyterLab as `make lab` does (with the settings the set-up installs), opens
book/intro.md, runs every cell, and checks that the positional-encoding explorer found its
kernel (the live controls are enabled) and that asking Python for a new width redraws it.
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
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url + "api/status", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        lab.terminate()
        lab.wait(timeout=30)


def test_chapter_opens_as_notebook_and_widget_is_live(browser, lab_url: str) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(lab_url + "lab/tree/intro.md")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60000)  # a notebook, not text
    page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget",
                           timeout=30000)
    page.wait_for_timeout(1000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    widget = page.locator(".tfw").first
    widget.wait_for(timeout=180000)
    widget.scroll_into_view_if_needed()
    recompute = widget.locator("button", has_text="recompute")
    page.wait_for_function("(b) => !b.disabled", arg=recompute.element_handle(), timeout=30000)
    title = widget.locator("div").first
    page.wait_for_function("(t) => t.textContent.includes('x 64 dimensions')",
                           arg=title.element_handle(), timeout=30000)
    widget.locator("input[aria-label=d_model]").fill("16")
    recompute.click()
    page.wait_for_function("(t) => t.textContent.includes('x 16 dimensions')",
                           arg=title.element_handle(), timeout=30000)
    page.evaluate("window.jupyterapp.commands.execute('kernelmenu:shutdown')")
    page.close()
