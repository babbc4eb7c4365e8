"""The conftest.py hook that lets nbval run the MyST-markdown chapters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.nbval_myst import is_myst_notebook

ROOT = Path(__file__).resolve().parent.parent

FRONT_MATTER = """---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""


def chapter(*cells: str) -> str:
    body = "\n".join(f"```{{code-cell}} ipython3\n{cell}\n```\n" for cell in cells)
    return FRONT_MATTER + "\n# A chapter\n\nSome text.\n\n" + body


def test_recognises_notebooks_and_skips_the_rest(tmp_path: Path) -> None:
    (tmp_path / "chapter.md").write_text(chapter("x = 1"))
    (tmp_path / "plain.md").write_text("# Just a page\n\nkernelspec: is only mentioned here.\n")
    (tmp_path / "_build").mkdir()
    (tmp_path / "_build" / "copy.md").write_text(chapter("x = 1"))
    assert is_myst_notebook(tmp_path / "chapter.md")
    assert not is_myst_notebook(tmp_path / "plain.md")
    assert not is_myst_notebook(tmp_path / "_build" / "copy.md")
    assert is_myst_notebook(ROOT / "book" / "intro.md")
    assert not is_myst_notebook(ROOT / "book" / "appendix" / "notation.md")


def run_pytest(folder: Path) -> subprocess.CompletedProcess:
    """Run pytest on `folder` with only the collector plugin (not the repository's settings)."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    command = [sys.executable, "-m", "pytest", "-p", "tests.nbval_myst", "-p", "no:cacheprovider",
               "--nbval-lax", "--nbval-current-env", "-v", "--color=no",
               "--rootdir", str(folder), str(folder)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, capture_output=True, text=True, cwd=folder, env=env,
                          timeout=300)


def test_a_raising_cell_fails_the_run_and_names_the_chapter_and_cell(tmp_path: Path) -> None:
    (tmp_path / "good.md").write_text(chapter("x = 2", "assert x * 3 == 6"))
    (tmp_path / "bad.md").write_text(chapter("y = 1", "assert y == 2, 'the claim is false'"))
    (tmp_path / "plain.md").write_text("# Not a notebook\n")
    result = run_pytest(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out
    assert "FAILED bad.md::Cell 1 - Notebook cell execution failed" in out
    assert "bad.md::Cell 0" not in out.split("short test summary")[1]
    assert "the claim is false" in out
    assert "plain.md" not in out
    assert "1 failed, 3 passed" in out
