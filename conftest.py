"""Root pytest configuration: nbval runs the MyST-markdown chapters (see tests/nbval_myst.py)."""

pytest_plugins = ["tests.nbval_myst"]
