"""A pytest plugin that lets nbval test the book's MyST-markdown chapters.

nbval collects only ``.ipynb`` files and reads them with ``nbformat.read``. The chapters are
``book/**/*.md`` jupytext notebooks, so for those we collect an nbval file whose reader is
``jupytext.read``. Markdown without a kernelspec in its front matter (plain pages) and
anything in build or environment folders is not a notebook and is skipped. With
``--nbval-lax`` every code cell runs in a fresh kernel and a cell that raises fails the run.
"""

from __future__ import annotations

import types
from pathlib import Path

import jupytext
import nbval.plugin

SKIPPED_DIRS = {"_build", "_vendor", ".venv", "node_modules", ".ipynb_checkpoints"}


def is_myst_notebook(path: Path) -> bool:
    """True for a jupytext MyST notebook: front matter that names a kernelspec."""
    if path.suffix != ".md" or SKIPPED_DIRS.intersection(path.parts):
        return False
    head = path.read_text(encoding="utf-8")[:4000]
    if not head.startswith("---"):
        return False
    front_matter = head.split("\n---", 1)[0]
    return "kernelspec:" in front_matter


class MystNotebookFile(nbval.plugin.IPyNbFile):
    """An nbval notebook read from MyST markdown through jupytext."""

    def collect(self):
        jupytext_reader = types.SimpleNamespace(
            read=lambda path, as_version: jupytext.read(path, fmt="md:myst")
        )
        original, nbval.plugin.nbformat = nbval.plugin.nbformat, jupytext_reader
        try:
            cells = list(super().collect())
        finally:
            nbval.plugin.nbformat = original
        yield from cells


def pytest_collect_file(file_path: Path, parent):
    option = parent.config.option
    if (option.nbval or option.nbval_lax) and is_myst_notebook(file_path):
        return MystNotebookFile.from_parent(parent, path=file_path)
    return None
