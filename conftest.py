"""Root pytest configuration: nbval runs the MyST-markdown chapters (see tests/nbval_myst.py)."""

import os

# Before anything imports torch: OpenMP threads that spin while waiting run many times slower
# on a loaded machine; passive waiting keeps the tests (and the kernels nbval starts, which
# inherit the environment) fast under load. `make test` sets it too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The chapters' figures use the book's Matplotlib settings (larger text for the page's column).
os.environ.setdefault("MATPLOTLIBRC", os.path.join(os.path.dirname(__file__), "book",
                                                   "matplotlibrc"))

pytest_plugins = ["tests.nbval_myst"]
