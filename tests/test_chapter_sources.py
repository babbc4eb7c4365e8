"""Checks on the chapters' source that need no execution."""

import re
from pathlib import Path

import pytest

from tests.nbval_myst import is_myst_notebook

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(p for p in (ROOT / "book").rglob("*.md") if is_myst_notebook(p))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: str(p.relative_to(ROOT / "book")))
def test_progress_bars_are_text(chapter):
    """tqdm.auto draws a Jupyter widget bar, which the static page shows as a dead widget."""
    found = re.findall(r"^\s*(?:from|import) tqdm\.(?:auto|notebook|autonotebook)\b",
                       chapter.read_text(encoding="utf-8"), flags=re.M)
    assert not found, f"{chapter.name}: use `from tqdm import tqdm` (a text bar), not {found}"


def test_chapters_are_found():
    assert len(CHAPTERS) >= 25
