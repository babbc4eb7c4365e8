"""`jupyter-book build`, with the chapters read and executed several at a time.

Jupyter Book 1.x passes Sphinx no number of parallel jobs, so Sphinx reads one page at a time
and every chapter's notebook waits for the one before it. This runs the same command line with
Sphinx's parallel reading: TFBOOK_BUILD_JOBS processes (default: one per CPU core), each
executing its own chapters. Usage is that of `jupyter-book build`:

    python scripts/build_book.py build --all -W -n --keep-going .
"""

from __future__ import annotations

import functools
import os
import sys


def jobs() -> int:
    """The number of chapters executed at once: $TFBOOK_BUILD_JOBS, else the CPU cores."""
    text = os.environ.get("TFBOOK_BUILD_JOBS", "")
    if not text:
        return max(1, os.cpu_count() or 1)
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"error: TFBOOK_BUILD_JOBS must be a positive whole number, got {text!r}")
    return int(text)


def one_page_a_chunk(pages: list[str], _processes: int, _maxbatch: int = 10) -> list[list[str]]:
    """Hand the processes one page at a time, so that a long chapter never holds others back.

    Sphinx's own make_chunks gives each process a batch of up to 14 pages (sorted by name):
    whoever draws the batch of slow chapters finishes long after the other.
    """
    return [[page] for page in pages]


def main() -> int:
    import jupyter_book.sphinx
    import sphinx.builders
    from jupyter_book.cli.main import main as jupyter_book_main

    sphinx.builders.make_chunks = one_page_a_chunk

    # The CLI imports build_sphinx from jupyter_book.sphinx when it runs: give it the jobs.
    jupyter_book.sphinx.build_sphinx = functools.partial(jupyter_book.sphinx.build_sphinx,
                                                         jobs=jobs())
    return jupyter_book_main()


if __name__ == "__main__":
    sys.exit(main())
