"""A learner's path: JupyterLab opens a .md chapter as a notebook, and its widget is live.

Starts JupyterLab as `make lab` does (with scripts/jupyterlab-overrides.json, the settings
the set-up installs), opens book/text/positional_encoding.md, waits for its kernel to be
idle, runs every cell, and checks that the positional-encoding explorer found its kernel (the
live controls are enabled), that asking Python for a new width shows Python busy and then
redraws it, and that after Kernel > Restart the widget says it lost its Python and how to
get a live one back. Every step waits for a
condition, with time limits meant for a loaded 2-core machine (the kernel imports torch
there in tens of seconds).

Reading a chapter must not change it: JupyterLab saves an opened notebook (autosave) with
its kernel's name and through jupytext's writer. Every chapter goes through that writer as
JupyterLab's contents manager runs it (book/jupytext.toml read, the kernelspec JupyterLab
writes) and comes back byte for byte; and one chapter opened in the browser, its kernel
started, then saved, keeps its bytes. No "Jupyter news" prompt covers the first page.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

OVERRIDES = ROOT / "scripts" / "jupyterlab-overrides.json"
# the chapters: MyST notebooks with a jupytext header (the appendix's plain pages have none)
CHAPTERS = sorted(path for path in (ROOT / "book").rglob("*.md")
                  if path.read_text(encoding="utf-8").startswith("---\njupytext:"))

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


def lab_kernelspec() -> dict[str, str]:
    """The kernelspec JupyterLab writes into a notebook when its python3 kernel starts:
    name, display name and language of the installed kernel, in that order."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    return {"name": "python3", "display_name": spec.display_name, "language": spec.language}


def lab_contents_manager(root: Path):
    """JupyterLab's contents manager with jupytext, as `jupyter lab` builds it."""
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
    from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

    return build_async_jupytext_contents_manager_class(AsyncLargeFileManager)(root_dir=str(root))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: str(p.relative_to(ROOT / "book")))
def test_saving_an_opened_chapter_keeps_its_bytes(tmp_path: Path, chapter: Path) -> None:
    """A chapter read and saved by JupyterLab's contents manager, after JupyterLab set the
    kernelspec of the kernel it started, is the same file byte for byte."""
    shutil.copy(ROOT / "book" / "jupytext.toml", tmp_path / "jupytext.toml")
    shutil.copy(chapter, tmp_path / chapter.name)
    manager = lab_contents_manager(tmp_path)

    async def open_and_save() -> None:
        model = await manager.get(chapter.name, content=True, type="notebook")
        notebook = json.loads(json.dumps(model["content"], default=str))  # as sent to the page
        notebook["metadata"]["kernelspec"] = lab_kernelspec()
        notebook["metadata"]["language_info"] = {"name": "python", "version": sys.version}
        await manager.save({"type": "notebook", "content": notebook}, chapter.name)

    # in a thread of its own: Playwright's sync API, open in the same session, keeps an event
    # loop running in this one
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, open_and_save()).result()
    saved = (tmp_path / chapter.name).read_text(encoding="utf-8")
    original = chapter.read_text(encoding="utf-8")
    if saved != original:
        import difflib

        diff = "".join(list(difflib.unified_diff(original.splitlines(True),
                                                 saved.splitlines(True), "chapter", "saved"))[:40])
        pytest.fail(f"JupyterLab would rewrite {chapter.name} on save:\n{diff}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a copy of the book, with the overrides of the set-up; yields (url, book)."""
    port = free_port()
    folder = tmp_path_factory.mktemp("lab")
    log = folder / "lab.log"
    # a copy of the book: nothing the session saves (autosave) can touch the sources
    shutil.copytree(ROOT / "book", folder / "book")
    settings = folder / "settings"  # what `make setup` installs beside JupyterLab
    shutil.copytree(Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings", settings,
                    dirs_exist_ok=True)
    shutil.copy(OVERRIDES, settings / "overrides.json")
    command = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
               f"--port={port}", "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=",
               "--ServerApp.password=", f"--ServerApp.root_dir={folder / 'book'}",
               f"--LabApp.app_settings_dir={settings}",
               f"--LabApp.workspaces_dir={folder / 'workspaces'}",  # no tab of an earlier run
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
        yield url, folder / "book"
    finally:
        lab.terminate()
        lab.wait(timeout=60)


def test_chapter_opens_as_notebook_and_widget_is_live(browser, lab) -> None:
    lab_url, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(lab_url + "lab/tree/text/positional_encoding.md?reset")  # this chapter alone
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=KERNEL_MS)  # a notebook, not text
    page.wait_for_function(KERNEL_IDLE, timeout=KERNEL_MS)
    page.wait_for_selector(".jp-NotebookPanel-toolbar "
                           ".jp-Notebook-ExecutionIndicator[data-status=idle]", timeout=KERNEL_MS)
    # start the run without waiting on the command (its promise settles when all cells ran)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    widget = page.locator(".tfw", has=page.locator("input[aria-label=d_model]")).first
    widget.wait_for(timeout=RUN_MS)
    widget.scroll_into_view_if_needed()
    recompute = widget.locator("button", has_text="recompute")
    page.wait_for_function("(b) => !b.disabled", arg=recompute.element_handle(), timeout=LIVE_MS)
    title = widget.locator("div").first
    # the widget says when Python is computing: record the states its root goes through
    widget.evaluate("""(root) => {
      window.tfwStates = [root.dataset.python];
      new MutationObserver(() => window.tfwStates.push(root.dataset.python))
        .observe(root, { attributes: true, attributeFilter: ["data-python"] });
    }""")
    widget.locator("input[aria-label=d_model]").fill("16")
    recompute.click()
    page.wait_for_function("(t) => t.textContent.includes('x 16 dimensions')",
                           arg=title.element_handle(), timeout=LIVE_MS)
    page.wait_for_function("(r) => r.dataset.python === 'live'", arg=widget.element_handle(),
                           timeout=LIVE_MS)
    states = page.evaluate("window.tfwStates")  # each redraw re-sets the attribute
    assert [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]] == [
        "live", "busy", "live"]
    # Kernel > Restart: the widget says it lost its Python and how to get a live one back
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session"
                  ".kernel.restart()")
    page.wait_for_function("(r) => r.dataset.python === 'gone'", arg=widget.element_handle(),
                           timeout=LIVE_MS)
    assert "Run its cell again" in widget.inner_text()
    assert recompute.is_disabled()
    page.evaluate("window.jupyterapp.commands.execute('kernelmenu:shutdown')")
    page.close()


def test_an_opened_chapter_saves_unchanged_and_no_news_prompt(browser, lab) -> None:
    """Open a chapter, let its kernel start (JupyterLab writes the kernelspec into the
    notebook), save it: the file keeps its bytes. No "Jupyter news" prompt was shown."""
    lab_url, book = lab
    chapter = "learning/in_your_browser.md"
    before = (book / chapter).read_bytes()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(lab_url + "lab/tree/" + chapter + "?reset")  # this chapter alone
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=KERNEL_MS)
    page.wait_for_function(KERNEL_IDLE, timeout=KERNEL_MS)
    page.wait_for_function("""() => {
      const panel = window.jupyterapp.shell.currentWidget;
      const spec = panel.model.getMetadata("kernelspec");
      return Boolean(spec && spec.display_name);
    }""", timeout=KERNEL_MS)  # JupyterLab has written its kernel into the notebook
    saved_at = (book / chapter).stat().st_mtime_ns
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + 60
    while (book / chapter).stat().st_mtime_ns == saved_at and time.monotonic() < deadline:
        time.sleep(0.2)  # the save is asynchronous: wait for the file to be written
    assert (book / chapter).stat().st_mtime_ns != saved_at, "JupyterLab did not save"
    assert (book / chapter).read_bytes() == before
    assert "Jupyter news" not in page.locator("body").inner_text()
    page.evaluate("window.jupyterapp.commands.execute('kernelmenu:shutdown')")
    page.close()
