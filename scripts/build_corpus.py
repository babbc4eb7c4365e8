"""Rebuild the shipped corpus file, tfbook/data/stdlib_corpus.txt.xz, from this Python.

    .venv/bin/python scripts/build_corpus.py

It reads the standard library in a fresh isolated interpreter (tfbook.corpus.build_stdlib_corpus)
and writes the text xz-compressed. Run it with Python 3.11.7 to reproduce the shipped file's
text (its SHA-256 is tfbook.corpus.CORPUS_SHA256); on another release it prints the new
release and hash to put in tfbook/corpus.py, and every exact number of Part I moves with it.
"""

import lzma
import platform

from tfbook.corpus import (
    CORPUS_FILE,
    CORPUS_PYTHON,
    CORPUS_SHA256,
    build_stdlib_corpus,
    corpus_sha256,
)


def main() -> None:
    text = build_stdlib_corpus()
    CORPUS_FILE.parent.mkdir(parents=True, exist_ok=True)
    CORPUS_FILE.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    digest = corpus_sha256(text)
    print(f"{CORPUS_FILE}: {len(text):,} characters from Python {platform.python_version()}, "
          f"SHA-256 {digest}")
    if digest != CORPUS_SHA256 or platform.python_version() != CORPUS_PYTHON:
        print(f"this differs from the shipped corpus (Python {CORPUS_PYTHON}, {CORPUS_SHA256}):"
              f" set CORPUS_PYTHON and CORPUS_SHA256 in tfbook/corpus.py")


if __name__ == "__main__":
    main()
