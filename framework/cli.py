"""Command-line checks that run before Hydra: unknown group choices get the registry's did-you-mean, misspelt
setting keys get a did-you-mean over the keys that exist there, and values of the wrong type name the expected type."""

from __future__ import annotations

import difflib
import os
import sys

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from framework.errors import BadSettingError, UnknownNameError
from framework.preflight import preflight
from framework.registry import GROUPS


def check_choices(argv: list[str]) -> None:
    """Raise UnknownNameError for `group=choice` arguments naming nothing registered (sweeps included)."""
    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except OverrideParseException:
        return  # Hydra reports malformed overrides itself
    for ov in overrides:
        key = ov.key_or_group
        if key == "size" and not ov.is_delete():  # the size presets live in conf/size/, not in a registry
            from framework.recipe import SIZES

            bad = [str(v) for v in _values(ov) if str(v) not in SIZES]
            if bad:
                raise UnknownNameError("size", bad[0], list(SIZES))
            continue
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


def check_settings(argv: list[str], config_name: str = "train") -> None:
    """Compose the config the way Hydra will and raise `BadSettingError` for an unknown key or a mistyped value.

    Runs only when there are plain `key=value` overrides (sweeps are left to Hydra). Needs the store registered.
    """
    args = [a for a in argv if "=" in a and not a.startswith(("-", "+", "~", "hydra."))]
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except OverrideParseException:
        return
    if any(ov.is_sweep_override() for ov in overrides) or all(ov.key_or_group in GROUPS for ov in overrides):
        return
    from hydra import compose, initialize
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    search = [a for a in argv if a.startswith("hydra.searchpath=")]  # where YAML recipes may come from
    with initialize(version_base="1.3", config_path=None):
        try:
            compose(config_name, overrides=[*search, *args])
            return
        except ConfigCompositionException as err:
            cause = err.__cause__
            key = getattr(cause, "full_key", None)
            if key is None:
                raise BadSettingError(str(err)) from None
            given = next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key), None)
            if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
                parent, _, leaf = key.rpartition(".")
                base = compose(config_name, overrides=[*search, *(a for a in args if a.split("=", 1)[0] != key)])
                node = OmegaConf.select(base, parent) if parent else base
                keys = node.keys() if hasattr(node, "keys") else []
                known = sorted(str(k) for k in keys if not str(k).startswith("_"))
                close = difflib.get_close_matches(leaf, known, n=3, cutoff=0.6)
                hint = f" Did you mean {' or '.join(repr(f'{parent}.{c}' if parent else c) for c in close)}?"
                where = f"of {parent}" if parent else "at the top level"
                raise BadSettingError(
                    f"Unknown setting {key!r}.{hint if close else ''} Valid settings {where}: {', '.join(known)}"
                    f" (to add a new key on purpose, write +{key}=...)"
                ) from None
            if isinstance(cause, ValidationError):
                reason = str(cause).splitlines()[0]
                raise BadSettingError(f"Bad value for {key}: {given!r}. {reason}") from None
            raise BadSettingError(f"{key}: {str(cause).splitlines()[0]}") from None


def check_command_line(argv: list[str], config_name: str = "train") -> list[str]:
    """Everything `python -m framework.train` checks before Hydra runs: names (did-you-mean), the recipe's values
    fitted to swapped groups (`framework.recipe.fit_to_choices`, with a note), setting keys and types, then the
    preflight (`framework.preflight`). Bad input raises (UnknownNameError, BadSettingError, PreflightError: exit 2 at
    the edge). Returns the argv to run: with `FRAMEWORK_SMOKE=1`, the recipe's smoke overrides come first
    (`framework.recipe.smoke_overrides`)."""
    from framework.recipe import fit_to_choices, smoke_overrides

    check_choices(argv)  # names first: an unknown choice gets its did-you-mean
    for note in fit_to_choices(argv):
        print(f"note: {note}", file=sys.stderr)
    check_choices(argv)
    check_settings(argv, config_name)
    if os.environ.get("FRAMEWORK_SMOKE", "0") not in ("", "0"):
        # just before the command's own overrides: Hydra takes overrides as one unbroken run of words
        at = next((i for i, a in enumerate(argv) if "=" in a and not a.startswith("-")), len(argv))
        argv = argv[:at] + smoke_overrides(argv) + argv[at:]
    preflight(argv, config_name)
    return argv
