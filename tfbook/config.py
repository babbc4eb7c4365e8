"""Validation shared by every config: errors speak in the config's own field names.

    GPTConfig(n_heads=0)  ->  ValueError: GPTConfig: n_heads must be a positive int, got 0
"""

import math
from typing import Any


def _name(config: Any) -> str:
    return type(config).__name__


def check_positive(config: Any, *fields: str) -> None:
    """Each named field must be an int >= 1 (a bool is not an int here)."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{_name(config)}: {field} must be a positive int, got {value!r}")


def check_probability(config: Any, *fields: str) -> None:
    """Each named field must be a number in [0, 1] (a dropout rate)."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0.0 <= value <= 1.0
        ):
            raise ValueError(f"{_name(config)}: {field} must lie in [0, 1], got {value!r}")


def check_choice(config: Any, field: str, choices: tuple[str, ...]) -> None:
    """The named field must be one of `choices`."""
    value = getattr(config, field)
    if value not in choices:
        raise ValueError(f"{_name(config)}: {field} must be one of {choices}, got {value!r}")
