"""The two numeric configurations of `make test` (see the root conftest.py and CONTRIBUTING.md).

The chapters execute twice: in the book build and under nbval. Each execution runs under its
own configuration, so a claim that holds for one order of floating-point sums only (one
thread count, one SIMD width, one CPU) fails on every machine:

- the book build: the environment as given, i.e. the machine's defaults (the widest CPU
  kernels torch finds, every core) unless ATEN_CPU_CAPABILITY, OMP_NUM_THREADS, ... are set;
- pytest's own process, the kernels nbval starts and the processes tests start: torch's scalar
  kernels on one thread, ``ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1`` (on any x86-64),
  or the machine's default kernels on two threads when the build already runs the scalar ones.

Either can be given with an environment variable of ``NAME=value`` pairs, e.g.
``TFBOOK_TEST_NUMERICS="ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=2"``, and
``TFBOOK_BUILD_NUMERICS="ATEN_CPU_CAPABILITY=avx512"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

NUMERIC_NAMES = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "MKL_ENABLE_INSTRUCTIONS")
SCALAR_ONE_THREAD = "ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1"
DEFAULT_KERNELS_TWO_THREADS = "OMP_NUM_THREADS=2"


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


def resolve(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(tests' numerics, build's numerics) for an environment, as the docstring above says."""
    if "TFBOOK_BUILD_NUMERICS" in environ:
        build = parse_numerics(environ["TFBOOK_BUILD_NUMERICS"], "TFBOOK_BUILD_NUMERICS")
    else:  # as given: what the reader's environment sets, else the machine's defaults
        build = {k: environ[k] for k in NUMERIC_NAMES if environ.get(k)}
    if "TFBOOK_TEST_NUMERICS" in environ:
        test = parse_numerics(environ["TFBOOK_TEST_NUMERICS"], "TFBOOK_TEST_NUMERICS")
    else:
        test = parse_numerics(SCALAR_ONE_THREAD, "")
        if test == build:  # the build runs them already: contrast with the default kernels
            test = parse_numerics(DEFAULT_KERNELS_TWO_THREADS, "")
    return test, build


def both_given(environ: Mapping[str, str]) -> bool:
    """True when the reader chose both configurations (they may then be the same)."""
    return "TFBOOK_BUILD_NUMERICS" in environ and "TFBOOK_TEST_NUMERICS" in environ


# Resolved once, from the environment pytest started with, by the root conftest.py (which
# then replaces the numeric variables of this process with the tests' configuration).
STARTING_ENVIRONMENT: dict[str, str] = dict(os.environ)
TEST_NUMERICS, BUILD_NUMERICS = resolve(STARTING_ENVIRONMENT)


def with_numerics(environment: Mapping[str, str], settings: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environment` without any numeric setting of its own, plus `settings`."""
    env = {k: v for k, v in environment.items() if k not in NUMERIC_NAMES}
    env.update(settings)
    return env


def describe(settings: Mapping[str, str]) -> str:
    """'ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1', or the machine's defaults."""
    return " ".join(f"{k}={v}" for k, v in settings.items()) or "the machine's defaults"
