"""Command-line checks that run before Hydra: unknown group choices get the registry's did-you-mean, misspelt
setting keys get a did-you-mean over the keys that exist there, and values of the wrong type name the expected type."""

from __future__ import annotations

import difflib
import shlex
import sys

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from framework.env import check_environment, smoke_requested
from framework.errors import BadSettingError, UnknownNameError
from framework.preflight import preflight
from framework.registry import GROUPS

#: Hydra's flags that take the next word as their value (`--info` and `--cfg` only when it is one of their choices)
_FLAG_VALUES = {"-cp": None, "--config-path": None, "-cn": None, "--config-name": None, "-cd": None,
                "--config-dir": None, "-p": None, "--package": None, "--experimental-rerun": None,
                "-c": ("job", "hydra", "all"), "--cfg": ("job", "hydra", "all"),
                "-i": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
                "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")}


def overrides_of(argv: list[str]) -> list[str]:
    """The words of `argv` Hydra reads as overrides: every word that is not a flag or a flag's value."""
    words, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            choices = _FLAG_VALUES.get(arg, ())
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = nxt is not None and (choices is None or nxt in choices)
            continue
        words.append(arg)
    return words


def check_parses(argv: list[str]) -> None:
    """BadSettingError, before anything runs, for an override Hydra's grammar refuses; the message shows the word and
    how to quote it (a value with a space that the shell split in two is the usual cause)."""
    words = overrides_of(argv)
    parser = OverridesParser.create()
    for i, word in enumerate(words):
        try:
            parser.parse_overrides([word])
        except OverrideParseException as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            reason = "; ".join(ln for ln in lines if not ln.startswith(("Error parsing override", "See "))) or (
                "not in Hydra's override grammar")
            prev = words[i - 1] if i and "=" in words[i - 1] and "=" not in word else None
            if prev:  # `key=/my runs/a` typed unquoted: the shell made two words of it
                key, _, value = prev.partition("=")
                fix = shlex.quote(f"{key}={value} {word}")
                hint = f"a value with a space must reach the program as one word: quote it, e.g. {fix}"
            else:
                key, _, value = word.partition("=")
                fix = f"\"{key}='{value}'\"" if "=" in word else f"{word}=VALUE"
                hint = f"every override is key=value; quote a value with special characters, e.g. {fix}"
            raise BadSettingError(f"cannot parse the override {word!r} ({reason}): {hint}") from None


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
    from hydra import compose
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from framework.compose import hydra_context

    search = [a for a in argv if a.startswith("hydra.searchpath=")]  # where YAML recipes may come from
    # appended and deleted keys and groups (`+callbacks=hub_push`, `~seed`) are composed too, in the order given
    composed = [a for a in overrides_of(argv) if a in args or (a.startswith(("+", "~"))
                                                        and not a.lstrip("+~").startswith("hydra."))]
    with hydra_context(job_name="cli"):
        try:
            compose(config_name, overrides=[*search, *composed])
            return
        except ConfigCompositionException as err:
            cause = err.__cause__
            key = getattr(cause, "full_key", None)
            if key is None:
                raise BadSettingError(" ".join(str(err).split())) from None
            given = next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key), None)
            if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
                raise BadSettingError(_unknown_setting(key, [*search, *composed], config_name)) from None
            if isinstance(cause, ValidationError):
                reason = str(cause).splitlines()[0]
                raise BadSettingError(f"Bad value for {key}: {given!r}. {reason}") from None
            raise BadSettingError(f"{key}: {str(cause).splitlines()[0]}") from None


def _unknown_setting(key: str, overrides: list[str], config_name: str) -> str:
    """The message for an override of `key`, which the composed config lacks: the keys that exist where it points (a
    did-you-mean), an unchosen callback's `+callbacks=NAME`, or how to add a key on purpose."""
    from hydra import compose
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    rest = [a for a in overrides if not a.lstrip("+~").split("=", 1)[0].startswith((f"{key}.", f"{key}="))]
    groups = [a for a in overrides if a.lstrip("+~").split("=", 1)[0] in (*GROUPS, "hydra.searchpath")]
    node, known = None, []
    for attempt in (rest, groups):  # without the key (else with group choices only): where the key would go
        try:
            base = compose(config_name, overrides=attempt)
        except ConfigCompositionException:
            continue
        node = OmegaConf.select(base, parent) if parent else base
        known = sorted(str(k) for k in (node.keys() if hasattr(node, "keys") else []) if not str(k).startswith("_"))
        break
    typed = next((a.lstrip("+~").split("=", 1)[0] for a in overrides
                  if a.lstrip("+~").split("=", 1)[0].startswith(f"{key}.")), key)
    if parent == "callbacks" and leaf in GROUPS["callbacks"]:
        chosen = ",".join(known)
        listed = f"{chosen},{leaf}" if chosen else leaf
        return (f"Unknown setting {typed!r}: the callback {leaf!r} is not among this run's callbacks"
                f" ({chosen or 'none'}); add it with +callbacks={leaf} (or list them all: callbacks=[{listed}])")
    if parent and node is None:
        return (f"Unknown setting {typed!r}: {parent} is null, so it has no settings; to give it some, write"
                f" +{typed}=... (and + before each of its keys)")
    close = difflib.get_close_matches(leaf, known, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(f'{parent}.{c}' if parent else c) for c in close)}?" if close else ""
    where = f"of {parent}" if parent else "at the top level"
    return (f"Unknown setting {key!r}.{hint} Valid settings {where}: {', '.join(known)}"
            f" (to add a new key on purpose, write +{key}=...)")


def check_command_line(argv: list[str], config_name: str = "train") -> list[str]:
    """Everything `python -m framework.train` checks before Hydra runs: names (did-you-mean), the recipe's values
    fitted to swapped groups (`framework.recipe.fit_to_choices`, with a note), setting keys and types, then the
    preflight (`framework.preflight`). Bad input raises (UnknownNameError, BadSettingError, PreflightError: exit 2 at
    the edge). Returns the argv to run: with `FRAMEWORK_SMOKE=1`, the recipe's smoke overrides come first
    (`framework.recipe.smoke_overrides`)."""
    from framework.recipe import fit_to_choices, smoke_overrides

    check_environment()
    check_parses(argv)
    check_choices(argv)  # names first: an unknown choice gets its did-you-mean
    for note in fit_to_choices(argv):
        print(f"note: {note}", file=sys.stderr)
    check_choices(argv)
    check_settings(argv, config_name)
    if smoke_requested():
        # just before the command's own overrides: Hydra takes overrides as one unbroken run of words
        at = next((i for i, a in enumerate(argv) if "=" in a and not a.startswith("-")), len(argv))
        argv = argv[:at] + smoke_overrides(argv) + argv[at:]
    preflight(argv, config_name)
    return argv

