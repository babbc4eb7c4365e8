"""The attention kernels as pytest parameters, shared by the model tests.

"flash" is skipped, with the reason named, only where its module tfbook.flash is missing.
"""

import importlib.util

import pytest

from tfbook.attention import ATTENTION_KERNELS

HAS_FLASH = importlib.util.find_spec("tfbook.flash") is not None
KERNELS = [
    pytest.param(kernel, marks=pytest.mark.skipif(
        kernel == "flash" and not HAS_FLASH,
        reason="the flash kernel's module tfbook.flash is missing"))
    for kernel in ATTENTION_KERNELS
]
# every kernel switched to tfbook's own code: attention, LayerNorm and activation
OWN_CODE = {"attention": "reference", "fused_norm": False, "fused_activation": False}
