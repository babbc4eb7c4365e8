"""Shared fixtures: the built book and a headless Chromium (see tests/browser.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import CHROMIUM_ARGS, chromium_path

ROOT = Path(__file__).resolve().parent.parent
# The book is built into $TFBOOK_OUTPUT/_build (default: the repository), with the table of
# contents $TFBOOK_TOC (default: _toc.yml): lets a chapter in progress be built on its own.
OUTPUT = Path(os.environ.get("TFBOOK_OUTPUT", ROOT))
TOC = Path(os.environ.get("TFBOOK_TOC", ROOT / "_toc.yml"))
BUILD = OUTPUT / "_build"
HTML = BUILD / "html"
ASSETS = ROOT / "_vendor" / "assets"


@pytest.fixture(scope="session")
def book_html() -> Path:
    """Build the whole book (every chapter executed, warnings as errors) into _build/html.

    Set TFBOOK_REUSE_BUILD=1 to test an existing build while working on the tests.
    """
    if os.environ.get("TFBOOK_REUSE_BUILD") == "1" and (HTML / "index.html").exists():
        return HTML
    if not (ASSETS / "require.min.js").exists():
        pytest.fail("the front-end files are missing: run `make vendor` (make test does it)")
    command = [str(Path(sys.executable).parent / "jupyter-book"), "build", "--all", "-W", "-n",
               "--keep-going", "--path-output", str(OUTPUT), "--toc", str(TOC), str(ROOT)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        pytest.fail(f"the book build failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
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
