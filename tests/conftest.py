"""Shared fixtures: the built book and a headless Chromium (see tests/browser.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import CHROMIUM_ARGS, chromium_path
from tests.numerics import BUILD_NUMERICS, with_numerics

ROOT = Path(__file__).resolve().parent.parent
# The book is built into $TFBOOK_OUTPUT/_build (default: the repository), with the table of
# contents $TFBOOK_TOC (default: _toc.yml): lets a chapter in progress be built on its own.
OUTPUT = Path(os.environ.get("TFBOOK_OUTPUT", ROOT))
TOC = Path(os.environ.get("TFBOOK_TOC", ROOT / "_toc.yml"))
BUILD = OUTPUT / "_build"
HTML = BUILD / "html"
ASSETS = ROOT / "_vendor" / "assets"


def build_command() -> list[str]:
    """jupyter-book build of the whole book, every chapter executed, warnings as errors."""
    return [str(Path(sys.executable).parent / "jupyter-book"), "build", "--all", "-W", "-n",
            "--keep-going", "--path-output", str(OUTPUT), "--toc", str(TOC), str(ROOT)]


def build_environment() -> dict[str, str]:
    """The book build runs under its own numeric configuration (tests/numerics.py)."""
    return with_numerics(os.environ, BUILD_NUMERICS)


# The book build executes every chapter in its own process. It starts as soon as the tests
# are collected and runs beside them (the unit tests and nbval's run of the chapters), so
# that on a 2-core machine the two halves of the work overlap; the tests that read the built
# pages run last and wait for it.
_BUILD: dict[str, object] = {}


def _reuse_build() -> bool:
    return os.environ.get("TFBOOK_REUSE_BUILD") == "1" and (HTML / "index.html").exists()


def pytest_collection_modifyitems(session, config, items) -> None:
    """Put the tests that need the built book last, and start the build in the background."""
    needs_book = [item for item in items if "book_html" in getattr(item, "fixturenames", ())]
    if not needs_book:
        return
    items[:] = [item for item in items if item not in needs_book] + needs_book
    if _reuse_build() or config.option.collectonly or not (ASSETS / "require.min.js").exists():
        return
    BUILD.mkdir(parents=True, exist_ok=True)
    log = open(BUILD / "book-build.log", "w", encoding="utf-8")  # noqa: SIM115 (kept open)
    _BUILD["process"] = subprocess.Popen(build_command(), stdout=log, stderr=subprocess.STDOUT,
                                         cwd=ROOT, env=build_environment())
    _BUILD["log"] = log


def pytest_sessionfinish(session, exitstatus) -> None:
    process = _BUILD.get("process")
    if process is not None and process.poll() is None:  # the session ended early
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def book_html() -> Path:
    """The whole book built (every chapter executed, warnings as errors) into _build/html.

    Set TFBOOK_REUSE_BUILD=1 to test an existing build while working on the tests.
    """
    if _reuse_build():
        return HTML
    if not (ASSETS / "require.min.js").exists():
        pytest.fail("the front-end files are missing: run `make vendor` (make test does it)")
    process = _BUILD.get("process")
    if process is None:  # collected without the hook (e.g. a single test id): build now
        result = subprocess.run(build_command(), capture_output=True, text=True, cwd=ROOT,
                                env=build_environment())
        code, output = result.returncode, result.stdout + result.stderr
    else:
        code = process.wait()
        _BUILD["log"].close()
        output = (BUILD / "book-build.log").read_text(encoding="utf-8", errors="replace")
    if code != 0:
        pytest.fail(f"the book build failed:\n{output[-9000:]}")
    return HTML


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, through Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()
