"""Root pytest configuration: nbval runs the MyST-markdown chapters (see tests/nbval_myst.py)."""

import os

# Before anything imports torch: OpenMP threads that spin while waiting run many times slower
# on a loaded machine; passive waiting keeps the tests (and the kernels nbval starts, which
# inherit the environment) fast under load. `make test` sets it too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

pytest_plugins = ["tests.nbval_myst"]
