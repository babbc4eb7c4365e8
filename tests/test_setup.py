"""The two commands on a machine that lacks something, and a book whose chapter raises."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.test_nbval_collector import chapter


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def test_make_without_python_311_says_what_to_install() -> None:
    result = make("check-tools", "PYTHON=/nonexistent/python3.11")
    assert result.returncode != 0
    assert "tfbook needs Python 3.11" in result.stdout
    assert "apt-get install python3.11" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_make_without_npm_says_what_to_install() -> None:
    result = make("check-tools", "NPM=npm-that-is-not-installed")
    assert result.returncode != 0
    assert "'npm-that-is-not-installed' was not found" in result.stdout
    assert "apt-get install nodejs npm" in result.stdout


def test_a_raising_chapter_fails_the_book_build_naming_chapter_and_cell(tmp_path: Path) -> None:
    """The book's own configuration, on a two-chapter book whose second chapter raises."""
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    shutil.copytree(ROOT / "book" / "_ext", tmp_path / "book" / "_ext")
    shutil.copy(ROOT / "book" / "references.bib", tmp_path / "book" / "references.bib")
    (tmp_path / "_vendor").mkdir()
    (tmp_path / "book" / "good.md").write_text(chapter("x = 1"))
    (tmp_path / "book" / "bad.md").write_text(
        chapter("y = 1", "assert y == 2, 'this claim no longer holds'"))
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/good\nchapters:\n  - file: book/bad\n")
    build_book = str(ROOT / "scripts" / "build_book.py")  # what `make book` runs
    result = subprocess.run([sys.executable, build_book, "build", "--all", "-W", "-n",
                             "--keep-going", str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    out = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)  # no colours
    assert result.returncode != 0
    assert "bad.md" in out and "Executing notebook failed" in out
    assert "assert y == 2, 'this claim no longer holds'" in out  # the cell, shown
    assert "AssertionError: this claim no longer holds" in out
