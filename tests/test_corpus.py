"""The default corpus is deterministic, about 1 MB, and the stress lines cover hard cases."""

import hashlib
import subprocess
import sys
import unicodedata

import pytest

from tfbook.corpus import stdlib_corpus, stress_lines


def test_corpus_size_and_cut():
    text = stdlib_corpus()
    assert 900_000 < len(text.encode("utf-8")) < 1_300_000
    part = stdlib_corpus(200_000)
    assert len(part.encode("utf-8")) <= 200_000
    assert part.endswith("\n") and text.startswith(part)
    assert stdlib_corpus(10**9) == text


def corpus_hash_in_fresh_interpreter(first_import: str = "") -> str:
    code = (f"{first_import}import hashlib; from tfbook.corpus import stdlib_corpus; "
            "print(hashlib.sha256(stdlib_corpus().encode()).hexdigest())")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_corpus_is_identical_in_a_fresh_interpreter():
    assert corpus_hash_in_fresh_interpreter() == hashlib.sha256(
        stdlib_corpus().encode()).hexdigest()


def test_corpus_ignores_libraries_that_patch_the_standard_library():
    # importing torch.package replaces inspect.getfile with its own function
    assert corpus_hash_in_fresh_interpreter("import torch.package; ") == (
        corpus_hash_in_fresh_interpreter())


def test_bad_max_bytes():
    with pytest.raises(ValueError, match="max_bytes must be a non-negative int or None, got -1"):
        stdlib_corpus(-1)


def test_stress_lines_cover_the_hard_cases():
    text = "".join(stress_lines())
    categories = {unicodedata.category(c) for c in text}
    assert {"Mn", "Cf", "Zs", "Lo"} <= categories  # combining marks, ZWJ/ZWSP, NBSP, CJK
    assert "\u200d" in text and "\u200b" in text and "\u00a0" in text and "\t" in text
    assert any("\U0001f1e6" <= c <= "\U0001f1ff" for c in text)  # regional-indicator flags
    assert any(unicodedata.bidirectional(c) in ("R", "AL") for c in text)  # Hebrew, Arabic
    assert any("\uac00" <= c <= "\ud7a3" for c in text)  # Hangul syllables
    assert stress_lines() is not stress_lines()  # callers get their own list
