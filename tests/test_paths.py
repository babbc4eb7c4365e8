"""book_file: the book's data found from any working directory."""

import os
from pathlib import Path

import pytest

from tfbook.paths import book_file


def test_resolves_from_another_working_directory(tmp_path):
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        path = book_file("learning/data/scaling_sweep.json")
    finally:
        os.chdir(old)
    assert path.is_absolute() and path.is_file()
    assert path == Path(__file__).resolve().parent.parent / "book/learning/data/scaling_sweep.json"


@pytest.mark.parametrize("bad, error, match", [
    (3, TypeError, "got int"),
    ("../README.md", ValueError, "inside book/"),
    ("/etc/passwd", ValueError, "inside book/"),
    ("learning/data/no_such_file.json", FileNotFoundError, "does not exist"),
])
def test_bad_paths_are_refused(bad, error, match):
    with pytest.raises(error, match=match):
        book_file(bad)
