"""Thread pinning for tests that claim bit-for-bit equality.

Two computations are bit-for-bit equal only when they run the same kernels in the same order:
such tests pin torch's thread count and run once with 1 and once with 2 threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

THREAD_COUNTS = pytest.mark.parametrize("n_threads", [1, 2], ids=["1-thread", "2-threads"])


@contextmanager
def pinned_threads(n: int) -> Iterator[None]:
    """Run the block with torch using exactly `n` threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
