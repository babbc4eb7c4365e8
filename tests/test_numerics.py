"""The two numeric configurations of `make test` are really in force, and they differ."""

import os

import pytest
import torch

from tests.conftest import build_environment
from tests.numerics import (
    BUILD_NUMERICS,
    NUMERIC_NAMES,
    STARTING_ENVIRONMENT,
    TEST_NUMERICS,
    both_given,
    parse_numerics,
    resolve,
    with_numerics,
)


def test_this_process_runs_the_test_configuration():
    if "ATEN_CPU_CAPABILITY" in TEST_NUMERICS:
        wanted = TEST_NUMERICS["ATEN_CPU_CAPABILITY"].upper()
        assert torch.backends.cpu.get_cpu_capability() == wanted
    assert {k: v for k, v in os.environ.items() if k in NUMERIC_NAMES} == TEST_NUMERICS


def test_the_build_runs_another_configuration():
    build = {k: v for k, v in build_environment().items() if k in NUMERIC_NAMES}
    assert build == BUILD_NUMERICS
    if both_given(STARTING_ENVIRONMENT) and TEST_NUMERICS == BUILD_NUMERICS:
        pytest.skip("TFBOOK_BUILD_NUMERICS and TFBOOK_TEST_NUMERICS were both set, to the same")
    assert build != TEST_NUMERICS, "the two executions of the chapters must differ"


@pytest.mark.parametrize("environ, test, build", [
    ({}, {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}, {}),
    # the reader's own settings go to the build; the tests contrast with scalar kernels
    ({"OMP_NUM_THREADS": "4"}, {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"},
     {"OMP_NUM_THREADS": "4"}),
    # a build already on scalar kernels and one thread: the tests take the default kernels
    ({"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2"},
     {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}),
    ({"TFBOOK_TEST_NUMERICS": "ATEN_CPU_CAPABILITY=avx2", "OMP_NUM_THREADS": "3"},
     {"ATEN_CPU_CAPABILITY": "avx2"}, {"OMP_NUM_THREADS": "3"}),
    ({"TFBOOK_BUILD_NUMERICS": "", "ATEN_CPU_CAPABILITY": "avx2"},
     {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}, {}),
])
def test_resolve(environ, test, build):
    assert resolve(environ) == (test, build)


def test_with_numerics_replaces_every_numeric_setting():
    env = with_numerics({"PATH": "/bin", "OMP_NUM_THREADS": "4", "ATEN_CPU_CAPABILITY": "avx2"},
                        {"OMP_NUM_THREADS": "1"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("text", ["OMP_NUM_THREADS", "PATH=/bin", "OMP_NUM_THREADS=", "=1"])
def test_bad_settings_are_refused(text):
    with pytest.raises(ValueError, match="NAME=value"):
        parse_numerics(text, "TFBOOK_TEST_NUMERICS")
