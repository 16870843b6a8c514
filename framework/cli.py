"""Command-line checks that run before Hydra: unknown group choices get the registry's did-you-mean."""

from __future__ import annotations

import sys

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from framework.registry import GROUPS, UnknownNameError


def check_choices(argv: list[str]) -> None:
    """Raise UnknownNameError for `group=choice` arguments naming nothing registered (sweeps included)."""
    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except OverrideParseException:
        return  # Hydra reports malformed overrides itself
    for ov in overrides:
        key = ov.key_or_group
        if key not in GROUPS or ov.is_delete():
            continue
        registry = GROUPS[key]
        for value in _values(ov):
            if value is not None and str(value) not in registry:
                raise UnknownNameError(registry.kind, str(value), registry.names(aliases=True))


def _values(ov) -> list:
    if ov.is_sweep_override():
        return list(ov.sweep_string_iterator())
    value = ov.value()
    return list(value) if isinstance(value, list) else [value]


def exit_on_unknown_choice(argv: list[str]) -> None:
    """`check_choices`, turned into one error line and exit code 2 (no stack trace)."""
    try:
        check_choices(argv)
    except UnknownNameError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
