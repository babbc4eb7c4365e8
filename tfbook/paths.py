"""Where the book's cached artefacts live, whatever folder a chapter is run from.

Chapters read small cached files (trained weights, sweeps) that sit beside them in
``book/<part>/data/``. A relative path works only when the notebook's working directory is
its own folder; ``book_file`` resolves the same path from the repository that holds this
package, so a chapter converted with jupytext and executed elsewhere still finds its data.
"""

from __future__ import annotations

from pathlib import Path

BOOK_ROOT = Path(__file__).resolve().parent.parent / "book"


def book_file(relative: str | Path) -> Path:
    """The path of ``book/<relative>`` in this repository (``"learning/data/scaling_sweep.json"``).

    Raises FileNotFoundError naming the path when the file is absent (for example when tfbook
    was installed without the book, not in editable mode from a clone).
    """
    if not isinstance(relative, (str, Path)):
        raise TypeError(f"book_file expects a path inside book/ as str or Path, "
                        f"got {type(relative).__name__}")
    relative = Path(relative)
    if relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"book_file expects a path inside book/ such as "
                         f"'learning/data/training_gpt', got {str(relative)!r}")
    path = BOOK_ROOT / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist: the book's data files come with a clone of the tfbook "
            f"repository (pip install -e . from the clone), not with the package alone")
    return path
