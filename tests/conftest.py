"""Shared fixtures: the built book and a headless Chromium (see tests/browser.py)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests import book_build
from tests.book_build import (  # noqa: F401 (where the tests import them from)
    BUILD,
    HTML,
    OUTPUT,
    TOC,
    build_command,
    build_environment,
)
from tests.browser import CHROMIUM_ARGS, chromium_path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "_vendor" / "assets"
# How much lower the tests' scheduling priority is than the book build's (nice levels).
BUILD_PRIORITY_LEAD = 5


def run_id(config) -> str:
    """One id for the whole test run, the same in every pytest-xdist worker."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return workerinput["testrunuid"]
    if getattr(config.option, "testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex
    return config.option.testrunuid


def pytest_configure(config) -> None:
    run_id(config)  # the controller's id, handed to the workers by pytest-xdist


def _reuse_build() -> bool:
    return os.environ.get("TFBOOK_REUSE_BUILD") == "1" and (book_build.HTML / "index.html").exists()


def pytest_collection_modifyitems(session, config, items) -> None:
    """Chapters first (the longest jobs), the tests that need the built book last; start it.

    Under pytest-xdist the work is handed out in this order (see pytest_xdist_make_scheduler).
    """
    needs_book = [item for item in items if "book_html" in getattr(item, "fixturenames", ())]
    chapters = [item for item in items if item.path.suffix == ".md" and item not in needs_book]
    rest = [item for item in items if item not in needs_book and item not in chapters]
    items[:] = chapters + rest + needs_book
    if (not needs_book or _reuse_build() or config.option.collectonly
            or not (ASSETS / "require.min.js").exists()):
        return
    book_build.start(run_id(config))
    # The build has started at the normal priority; the tests go on at a lower one, so that
    # the build, whose end the browser tests wait for, gets the processor first (the tests'
    # own kernels and subprocesses inherit it).
    os.nice(BUILD_PRIORITY_LEAD)


# The files whose tests are handed out one by one (they read the built pages, at the end).
ONE_BY_ONE = ("tests/test_browser.py", "tests/test_browser_explorer.py")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown when xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, but the tests of the built pages one by one.

    A chapter's cells and each test file go to one process as a unit (one kernel, one set of
    module fixtures), in the order of pytest_collection_modifyitems; the browser tests, which
    come last and all wait for the book, are shared by both processes.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesThenPages(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in ONE_BY_ONE else path

    return FilesThenPages(config, log)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test that reads the built book first waits for the build, outside its own time limit.

    pytest-timeout limits each test (setup included) to 10 minutes; the build can take longer
    on a loaded machine, and it has limits of its own (each chapter's execution timeout).
    """
    if ("book_html" in getattr(item, "fixturenames", ()) and not _reuse_build()
            and (ASSETS / "require.min.js").exists()):
        identity = run_id(item.config)
        book_build.start(identity)  # no-op if the collection hook (or another worker) did
        book_build.wait(identity)
    yield


def pytest_sessionfinish(session, exitstatus) -> None:
    if getattr(session.config, "workerinput", None) is None:  # the controller, or no xdist
        book_build.stop(run_id(session.config))


@pytest.fixture(scope="session")
def book_html(request) -> Path:
    """The whole book built (every chapter executed, warnings as errors) into _build/html.

    Set TFBOOK_REUSE_BUILD=1 to test an existing build while working on the tests.
    """
    if _reuse_build():
        return book_build.HTML
    if not (ASSETS / "require.min.js").exists():
        pytest.fail("the front-end files are missing: run `make vendor` (make test does it)")
    identity = run_id(request.config)
    book_build.start(identity)  # no-op if the collection hook (or another worker) started it
    code, output = book_build.wait(identity)
    if code != 0:
        pytest.fail(f"the book build failed:\n{output}")
    return book_build.HTML


PAGE_TIMEOUT_MS = 60_000  # Playwright's default, 30 s, is short on a loaded machine


class PatientBrowser:
    """A Playwright browser whose pages and contexts wait up to PAGE_TIMEOUT_MS by default for
    the conditions the tests wait for (an element drawn, a navigation); otherwise the browser."""

    def __init__(self, browser) -> None:
        self._browser = browser

    def new_page(self, **options):
        page = self._browser.new_page(**options)
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        return page

    def new_context(self, **options):
        context = self._browser.new_context(**options)
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        return context

    def __getattr__(self, name: str):
        return getattr(self._browser, name)


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, through Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        yield PatientBrowser(chromium)
        chromium.close()
