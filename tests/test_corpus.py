"""The default corpus is deterministic, about 1 MB, and the stress lines cover hard cases."""

import builtins
import lzma
import pdb
import platform
import subprocess
import sys
import unicodedata

import pytest

from tfbook import corpus
from tfbook.corpus import (
    CORPUS_PYTHON,
    CORPUS_SHA256,
    build_stdlib_corpus,
    corpus_sha256,
    stdlib_corpus,
    stress_lines,
)


def test_corpus_size_and_cut():
    text = stdlib_corpus()
    assert 900_000 < len(text.encode("utf-8")) < 1_300_000
    part = stdlib_corpus(200_000)
    assert len(part.encode("utf-8")) <= 200_000
    assert part.endswith("\n") and text.startswith(part)
    assert stdlib_corpus(10**9) == text


def corpus_hash_in_fresh_interpreter(first_import: str = "") -> str:
    code = (f"{first_import}from tfbook.corpus import corpus_sha256, stdlib_corpus; "
            "print(corpus_sha256(stdlib_corpus()))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_shipped_corpus_is_the_recorded_text():
    assert corpus_sha256(stdlib_corpus()) == CORPUS_SHA256
    assert len(stdlib_corpus()) == 1_052_433


def test_corpus_is_identical_in_a_fresh_interpreter():
    assert corpus_hash_in_fresh_interpreter() == CORPUS_SHA256


def test_corpus_ignores_what_a_kernel_or_a_library_swaps(monkeypatch):
    """An IPython kernel swaps builtins.input and pdb.Pdb; torch.package swaps
    inspect.getfile. None of it reaches the corpus, in this process or a new one."""
    assert corpus_hash_in_fresh_interpreter("import torch.package; ") == CORPUS_SHA256

    def swapped_input(prompt=""):
        """Not the builtin input."""

    swapped_input.__module__ = "some_kernel"
    monkeypatch.setattr(builtins, "input", swapped_input)
    monkeypatch.setattr(pdb, "Pdb", type("Pdb", (), {"__module__": "IPython.core.debugger"}))
    corpus._shipped_corpus.cache_clear()
    try:
        assert corpus_sha256(stdlib_corpus()) == CORPUS_SHA256
        # the in-process reader does see the swaps: that is why the text ships as a file
        assert corpus._read_standard_library() != stdlib_corpus()
    finally:
        monkeypatch.undo()
        corpus._shipped_corpus.cache_clear()


@pytest.mark.skipif(platform.python_version() != CORPUS_PYTHON,
                    reason=f"the shipped corpus was read from Python {CORPUS_PYTHON}")
def test_rebuilding_from_this_python_gives_the_shipped_bytes():
    assert build_stdlib_corpus() == stdlib_corpus()


def test_a_damaged_corpus_file_is_a_clear_error(tmp_path, monkeypatch):
    bad = tmp_path / "stdlib_corpus.txt.xz"
    bad.write_bytes(lzma.compress(b"not the corpus\n"))
    monkeypatch.setattr(corpus, "CORPUS_FILE", bad)
    corpus._shipped_corpus.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="has SHA-256 .* expected"):
            stdlib_corpus()
        bad.write_bytes(b"garbage")
        with pytest.raises(RuntimeError, match="missing or damaged"):
            stdlib_corpus()
    finally:
        monkeypatch.undo()
        corpus._shipped_corpus.cache_clear()


@pytest.mark.parametrize("bad", [-1, 1.5, "100", True])
def test_bad_max_bytes(bad):
    with pytest.raises(ValueError, match="max_bytes must be a non-negative int or None, got"):
        stdlib_corpus(bad)
    with pytest.raises(TypeError, match="corpus_sha256 expects a str, got bytes"):
        corpus_sha256(b"abc")


def test_stress_lines_cover_the_hard_cases():
    text = "".join(stress_lines())
    categories = {unicodedata.category(c) for c in text}
    assert {"Mn", "Cf", "Zs", "Lo"} <= categories  # combining marks, ZWJ/ZWSP, NBSP, CJK
    assert "\u200d" in text and "\u200b" in text and "\u00a0" in text and "\t" in text
    assert any("\U0001f1e6" <= c <= "\U0001f1ff" for c in text)  # regional-indicator flags
    assert any(unicodedata.bidirectional(c) in ("R", "AL") for c in text)  # Hebrew, Arabic
    assert any("\uac00" <= c <= "\ud7a3" for c in text)  # Hangul syllables
    assert stress_lines() is not stress_lines()  # callers get their own list
