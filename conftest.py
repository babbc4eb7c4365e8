"""Root pytest configuration: the tests' numeric configuration, and nbval over the chapters.

The chapters execute twice in `make test`, in the book build and under nbval, each under its
own numeric configuration (tests/numerics.py): the build with the environment as given (the
machine's defaults unless it sets them), this process and the kernels nbval starts with
torch's scalar kernels on one thread. nbval reads
the MyST-markdown chapters through tests/nbval_myst.py.
"""

import os
import sys

from tests.numerics import BUILD_NUMERICS, NUMERIC_NAMES, TEST_NUMERICS, describe

# Before anything imports torch: it reads both settings when it starts.
if "torch" in sys.modules:
    raise RuntimeError("torch was imported before the root conftest.py set the tests' numeric "
                       "configuration; run pytest from the repository root")
for _name in NUMERIC_NAMES:
    os.environ.pop(_name, None)
os.environ.update(TEST_NUMERICS)

# OpenMP threads that spin while waiting run many times slower on a loaded machine; passive
# waiting keeps the tests (and the kernels nbval starts, which inherit the environment) fast
# under load. `make test` sets it too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The chapters' figures use the book's Matplotlib settings (larger text for the page's column).
os.environ.setdefault("MATPLOTLIBRC", os.path.join(os.path.dirname(__file__), "book",
                                                   "matplotlibrc"))


def pytest_report_header(config):
    return [f"numerics of the tests and of the chapters under nbval: {describe(TEST_NUMERICS)}",
            f"numerics of the book build: {describe(BUILD_NUMERICS)}"]


pytest_plugins = ["tests.nbval_myst"]
