"""The environment variables framework reads, and the check that refuses an unknown value before anything runs.

| variable | values | what it does |
|---|---|---|
| `FRAMEWORK_SMOKE` | `0`, `1` | `1`: every `python -m framework.train` command runs at `size=smoke` (the README) |
| `FRAMEWORK_NS_DTYPE` | `bfloat16`, `float32` | OLion's Newton–Schulz dtype (`framework.optim.ns_dtype`) |
| `FRAMEWORK_RUN_ID` | any | set by a run for its own processes (`framework.run_lock`); not for users |

Unset or empty means the default.
"""

from __future__ import annotations

import os

from framework.errors import InputError

SMOKE = "FRAMEWORK_SMOKE"
SMOKE_VALUES = ("0", "1")


def smoke_requested() -> bool:
    """True when `FRAMEWORK_SMOKE=1` (InputError for a value other than 0 or 1)."""
    value = os.environ.get(SMOKE, "").strip()
    if value not in ("", *SMOKE_VALUES):
        raise InputError(f"{SMOKE}={value!r} is not a valid value: valid: {', '.join(SMOKE_VALUES)}"
                         " (1 runs the command at size=smoke), or unset")
    return value == "1"


def check_environment() -> None:
    """Every variable in the table above that is set holds a valid value (InputError naming it otherwise)."""
    smoke_requested()
    from framework.optim.ns_dtype import env_override

    try:
        env_override()
    except ValueError as err:
        raise InputError(f"{err} (or unset: measured per device)") from None
