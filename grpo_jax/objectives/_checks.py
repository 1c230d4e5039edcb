"""Argument checks shared by the objectives.

Hyper-parameters are Python numbers or strings, so they are checked eagerly, at trace
time, with messages that name the argument, the allowed values and the fix. Values that
arrive as traced arrays cannot be checked without a host round trip and are left alone.
"""

import numbers


def check_choice(name, value, allowed):
    """Raises ValueError unless `value` is one of `allowed`."""
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


def check_nonnegative(name, value):
    """Raises ValueError if the Python number `value` is negative."""
    if isinstance(value, numbers.Real) and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_greater(name, value, bound):
    """Raises ValueError unless the Python number `value` is > `bound`."""
    if isinstance(value, numbers.Real) and not value > bound:
        raise ValueError(f"{name} must be > {bound}, got {value}")


def check_group_size(group_size, num_rows, *, minimum=1):
    """Raises ValueError unless `group_size` >= minimum and divides `num_rows`."""
    if not isinstance(group_size, numbers.Integral) or group_size < minimum:
        raise ValueError(f"group_size must be an integer >= {minimum}, got {group_size!r}")
    if num_rows % group_size:
        raise ValueError(
            f"group_size={group_size} does not divide the batch of {num_rows} rows; "
            "rows are P prompts x G completions laid out consecutively, so the batch "
            "must hold whole groups")


def check_unit_interval(name, value):
    """Raises ValueError unless the Python number `value` is in [0, 1]."""
    if isinstance(value, numbers.Real) and not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
