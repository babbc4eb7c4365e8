"""The two numeric configurations of `make test` are really in force, and they differ."""

import os

import pytest
import torch

from tests.conftest import build_environment
from tests.numerics import (
    NUMERIC_NAMES,
    build_numerics,
    parse_numerics,
    test_numerics,
    with_numerics,
)


def test_this_process_runs_the_test_configuration():
    settings = test_numerics()
    if "ATEN_CPU_CAPABILITY" in settings:
        assert torch.backends.cpu.get_cpu_capability() == settings["ATEN_CPU_CAPABILITY"].upper()
    if "OMP_NUM_THREADS" in settings:
        assert os.environ["OMP_NUM_THREADS"] == settings["OMP_NUM_THREADS"]


def test_the_build_runs_another_configuration():
    build = {k: v for k, v in build_environment().items() if k in NUMERIC_NAMES}
    test = {k: v for k, v in os.environ.items() if k in NUMERIC_NAMES}
    assert build == build_numerics()
    assert build != test, "the two executions of the chapters must differ in their numerics"


def test_with_numerics_replaces_every_numeric_setting():
    env = with_numerics({"PATH": "/bin", "OMP_NUM_THREADS": "4", "ATEN_CPU_CAPABILITY": "avx2"},
                        {"OMP_NUM_THREADS": "1"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("text", ["OMP_NUM_THREADS", "PATH=/bin", "OMP_NUM_THREADS=", "=1"])
def test_bad_settings_are_refused(text):
    with pytest.raises(ValueError, match="NAME=value"):
        parse_numerics(text, "TFBOOK_TEST_NUMERICS")


def test_default_is_scalar_kernels_on_one_thread():
    assert parse_numerics("ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1", "X") == {
        "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
