"""The two numeric configurations of `make test` (see the root conftest.py and CONTRIBUTING.md).

The chapters execute twice: in the book build and under nbval. Each execution runs under its
own configuration, so a claim that holds for one order of floating-point sums only (one
thread count, one SIMD width, one CPU) fails on every machine:

- the book build: the machine's defaults (the widest CPU kernels torch finds, every core);
- pytest's own process, the kernels nbval starts and the processes tests start: torch's scalar
  kernels on one thread, ``ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1`` (on any x86-64).

Each can be replaced with an environment variable of ``NAME=value`` pairs, e.g.
``TFBOOK_TEST_NUMERICS="ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=2"``, and
``TFBOOK_BUILD_NUMERICS="ATEN_CPU_CAPABILITY=avx512"``.
"""

from __future__ import annotations

import os

NUMERIC_NAMES = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "MKL_ENABLE_INSTRUCTIONS")
DEFAULT_TEST_NUMERICS = "ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1"
DEFAULT_BUILD_NUMERICS = ""


def parse_numerics(text: str, variable: str) -> dict[str, str]:
    """'A=1 B=x' -> {'A': '1', 'B': 'x'}; only the numeric variables above are accepted."""
    settings = {}
    for pair in text.split():
        name, sep, value = pair.partition("=")
        if not sep or name not in NUMERIC_NAMES or not value:
            raise ValueError(f"{variable} expects space-separated NAME=value pairs with NAME one "
                             f"of {', '.join(NUMERIC_NAMES)}; got {pair!r} in {text!r}")
        settings[name] = value
    return settings


def test_numerics() -> dict[str, str]:
    """The configuration of pytest's process and everything it starts except the book build."""
    return parse_numerics(os.environ.get("TFBOOK_TEST_NUMERICS", DEFAULT_TEST_NUMERICS),
                          "TFBOOK_TEST_NUMERICS")


test_numerics.__test__ = False  # a function of this module, not a test


def build_numerics() -> dict[str, str]:
    """The configuration of the book build (empty: the machine's defaults)."""
    return parse_numerics(os.environ.get("TFBOOK_BUILD_NUMERICS", DEFAULT_BUILD_NUMERICS),
                          "TFBOOK_BUILD_NUMERICS")


def with_numerics(environment: dict[str, str], settings: dict[str, str]) -> dict[str, str]:
    """A copy of `environment` without any numeric setting of its own, plus `settings`."""
    env = {k: v for k, v in environment.items() if k not in NUMERIC_NAMES}
    env.update(settings)
    return env


def describe(settings: dict[str, str]) -> str:
    """'ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1', or the machine's defaults."""
    return " ".join(f"{k}={v}" for k, v in settings.items()) or "the machine's defaults"
