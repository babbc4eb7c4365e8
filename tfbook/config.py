"""Validation shared by every config: errors speak in the config's own field names.

    GPTConfig(n_heads=0)  ->  ValueError: GPTConfig: n_heads must be a positive int, got 0

Each check reads the named fields from `config` and names the config's class in its message;
`owner` names someone else when the settings are checked on behalf of another object (a
model config checking the block settings it passes on, a module checking its arguments).
"""

import math
import numbers
from typing import Any


def is_int(value: object) -> bool:
    """A Python or NumPy integer (a bool is not an int here)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A Python or NumPy real number (a bool is not a number here)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def owner_name(config: Any, owner: str | None = None) -> str:
    """The name an error message starts with: `owner`, or the config's class name."""
    return type(config).__name__ if owner is None else owner


def check_positive(config: Any, *fields: str, owner: str | None = None) -> None:
    """Each named field must be an int >= 1 (a bool is not an int here)."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{owner_name(config, owner)}: {field} must be a positive int, got {value!r}"
            )


def check_probability(config: Any, *fields: str, owner: str | None = None) -> None:
    """Each named field must be a number in [0, 1] (a dropout rate)."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0.0 <= value <= 1.0
        ):
            raise ValueError(
                f"{owner_name(config, owner)}: {field} must lie in [0, 1], got {value!r}"
            )


def check_choice(
    config: Any, field: str, choices: tuple[str, ...], owner: str | None = None
) -> None:
    """The named field must be one of `choices`."""
    value = getattr(config, field)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"{owner_name(config, owner)}: {field} must be one of {choices}, got {value!r}"
        )


def check_bool(config: Any, *fields: str, owner: str | None = None) -> None:
    """Each named field must be True or False (not 0, 1 or a string)."""
    for field in fields:
        value = getattr(config, field)
        if not isinstance(value, bool):
            raise ValueError(
                f"{owner_name(config, owner)}: {field} must be True or False, got {value!r}"
            )
