"""The parallel book build (scripts/build_book.py) and the build shared by the test processes."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest

from tests import book_build
from tests.conftest import ROOT


def load_build_book():
    spec = importlib.util.spec_from_file_location("build_book", ROOT / "scripts" / "build_book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jobs_default_to_the_cores_and_bad_values_are_refused(monkeypatch) -> None:
    build_book = load_build_book()
    monkeypatch.delenv("TFBOOK_BUILD_JOBS", raising=False)
    monkeypatch.setattr(build_book.os, "cpu_count", lambda: 3)
    assert build_book.jobs() == 3
    monkeypatch.setenv("TFBOOK_BUILD_JOBS", "1")
    assert build_book.jobs() == 1
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv("TFBOOK_BUILD_JOBS", bad)
        with pytest.raises(SystemExit, match=f"positive whole number, got '{bad}'"):
            build_book.jobs()


def test_each_page_is_a_chunk_of_its_own() -> None:
    pages = [f"book/p{i}" for i in range(40)]
    assert load_build_book().one_page_a_chunk(pages, 2) == [[page] for page in pages]


def test_the_site_extension_declares_only_undeclared_extensions_parallel_safe() -> None:
    spec = importlib.util.spec_from_file_location("site_ext", ROOT / "book" / "_ext" /
                                                  "tfbook_site.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    undeclared = types.SimpleNamespace(parallel_read_safe=None)
    refused = types.SimpleNamespace(parallel_read_safe=False)
    app = types.SimpleNamespace(extensions={"sphinx_multitoc_numbering": undeclared,
                                            "sphinx_jupyterbook_latex": refused,
                                            "other": types.SimpleNamespace(
                                                parallel_read_safe=None)})
    site.declare_parallel_reading(app, None)
    assert undeclared.parallel_read_safe is True
    assert refused.parallel_read_safe is False  # an extension that says no keeps its word
    assert app.extensions["other"].parallel_read_safe is None  # only the two named


@pytest.fixture
def build_dir(tmp_path, monkeypatch):
    """book_build pointed at an empty folder, with a build process that is only recorded."""
    monkeypatch.setattr(book_build, "BUILD", tmp_path)
    monkeypatch.setattr(book_build, "RECORD", tmp_path / "book-build.json")
    monkeypatch.setattr(book_build, "LOG", tmp_path / "book-build.log")
    started = []

    class FakeProcess:
        pid = 4242

        def __init__(self, command, **kwargs):
            started.append((command, kwargs))

    monkeypatch.setattr(book_build.subprocess, "Popen", FakeProcess)
    return tmp_path, started


def test_one_build_a_run_started_by_whoever_asks_first(build_dir) -> None:
    folder, started = build_dir
    (folder / "book-build.old.claim").touch()  # left by an earlier run
    assert book_build.start("run1") is True
    assert book_build.start("run1") is False  # another worker of the same run
    assert len(started) == 1 and started[0][1]["start_new_session"]
    assert started[0][0][-1] == "run1"
    assert not (folder / "book-build.old.claim").exists()
    record = json.loads((folder / "book-build.json").read_text())
    assert record == {"run": "run1", "pid": 4242, "code": None}
    assert book_build.start("run2") is True  # a new test run builds again
    assert len(started) == 2


def test_wait_returns_this_runs_code_and_log(build_dir) -> None:
    folder, _ = build_dir
    book_build.start("run1")
    (folder / "book-build.log").write_text("the build's output")
    (folder / "book-build.json").write_text(json.dumps({"run": "run1", "pid": 1, "code": 3}))
    assert book_build.wait("run1", poll_seconds=0) == (3, "the build's output")
    # a record of another run and no claim of this one: nothing will come, say so
    assert book_build.wait("run9", poll_seconds=0)[0] == 1
