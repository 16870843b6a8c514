"""Growth events for `OrthogonalGrowth`: its arguments and schedule expanded into checked events, recorded events
re-applied to a shape-only copy of a module (the module a checkpoint's weights load into), and the copies of the
model a module keeps (its EMA), which every event grows too."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from framework.grow.ops import DEFAULT_ZERO_PATTERNS, DEPTH_METHODS, Growth, grow

#: what one growth event sets (a schedule item may override any of them)
EVENT_KEYS = ("at_step", "at_epoch", "depth_factor", "depth_method", "ignore_first", "ignore_last",
              "zero_init_copies", "width_factor", "noise_alpha", "seed")
#: the event keys that change the model's shapes
STRUCTURE_KEYS = ("depth_factor", "depth_method", "ignore_first", "ignore_last", "width_factor")


def expand_schedule(base: dict[str, Any], schedule: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The checked growth events: each `schedule` item over the top-level values `base` (or `base` alone), the
    seed offset by the item's position unless the item sets it; refused unless in growth order."""
    items = list(schedule) if schedule else [{}]
    events: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        unknown = sorted(set(item) - set(EVENT_KEYS))
        if unknown:
            raise ValueError(f"schedule[{i}] has unknown keys {unknown}; valid: {', '.join(EVENT_KEYS)}")
        if schedule and ("at_step" in item or "at_epoch" in item):
            event = {**base, "at_step": None, "at_epoch": None, **item}
        else:
            event = {**base, **item}
        event["seed"] = int(event["seed"]) + (i if "seed" not in item else 0)
        events.append(check_event(event, i))
    for key in ("at_step", "at_epoch"):
        times = [e[key] for e in events if e[key] is not None]
        if times != sorted(times):
            raise ValueError(f"schedule {key} values {times} must be in growth order (non-decreasing)")
    return events


def replay_on_copy(pl_module: nn.Module, record: dict[str, Any]) -> nn.Module:
    """A meta-device copy of `pl_module` with the growth a checkpoint records applied: the module the checkpoint's
    weights will load into (shapes only, no memory; used to check a checkpoint before training resumes)."""
    tensors = [*pl_module.parameters(), *pl_module.buffers()]
    memo: dict[int, Any] = {id(t): nn.Parameter(torch.empty_like(t, device="meta"), requires_grad=t.requires_grad)
                            if isinstance(t, nn.Parameter) else torch.empty_like(t, device="meta") for t in tensors}
    clone = copy.deepcopy(pl_module, memo)
    model_attr, layers_attr = record.get("model_attr", "model"), record.get("layers_attr", "blocks")
    model = getattr(clone, model_attr) if model_attr else clone
    copies = model_copies(clone, model_attr, record.get("copy_attrs", []))  # e.g. the EMA, grown alike
    for event in record.get("done", []):
        apply_event(model, event, layers_attr, structure_only=True, copies=copies.values())
    return clone


def apply_event(module: nn.Module, event: dict[str, Any], layers_attr: str = "blocks",
                zero_patterns: Sequence[str] = DEFAULT_ZERO_PATTERNS, structure_only: bool = False,
                copies: Iterable[nn.Module] = ()) -> Growth:
    """Grow `module` by one growth event, then each of its `copies` (an EMA) by the same operation and seed applied to
    the copy's own weights (a frozen copy stays frozen). `structure_only`: the shapes alone (no noise, no zeroing:
    the weights a checkpoint holds are loaded next). Returns the growth of `module`."""
    args = dict(depth_factor=event["depth_factor"], depth_method=event["depth_method"],
                ignore_first=event["ignore_first"], ignore_last=event["ignore_last"],
                zero_init_copies=event.get("zero_init_copies", False) and not structure_only,
                width_factor=event["width_factor"], noise_alpha=0.0 if structure_only else event["noise_alpha"],
                seed=event.get("seed", 0), layers_attr=layers_attr, zero_patterns=zero_patterns)
    growth = grow(module, **args)
    for twin in copies:
        frozen = not any(p.requires_grad for p in twin.parameters())
        grow(twin, **args)
        if frozen:
            twin.requires_grad_(False)
    return growth


def model_copies(pl_module: nn.Module, model_attr: str, copy_attrs: Sequence[str]) -> dict[str, nn.Module]:
    """`pl_module`'s attributes named in `copy_attrs` that hold a module (e.g. `ema`); none when it is the model."""
    if not model_attr:
        return {}
    return {a: c for a in copy_attrs if isinstance(c := getattr(pl_module, a, None), nn.Module)}


def check_copies(trainer: Any, pl_module: nn.Module, model: nn.Module, model_attr: str,
                 copy_attrs: Sequence[str]) -> None:
    """ValueError unless every copy of `model` in the run is one growth grows: each of `copy_attrs` matches the model,
    no other child module of `pl_module` has the model's parameters, and no callback keeps an averaged copy."""
    shapes, owner = _shapes(model), type(pl_module).__name__
    for name, twin in model_copies(pl_module, model_attr, copy_attrs).items():
        if _shapes(twin) != shapes:
            raise ValueError(f"OrthogonalGrowth: {owner}.{name} (copy_attrs) is not a copy of .{model_attr} (their"
                             " parameters differ), so growing both alike would not keep them matching; leave it out"
                             " of copy_attrs")
    for name, child in pl_module.named_children() if model_attr and shapes else ():
        if child is not model and name not in copy_attrs and _shapes(child) == shapes:
            raise ValueError(f"OrthogonalGrowth: {owner}.{name} is a copy of the model that growth would leave at its"
                             " old size; name it in copy_attrs (callbacks.orthogonal_growth.copy_attrs="
                             f"[{','.join([*copy_attrs, name])}]) so it grows too")
    from lightning.pytorch import callbacks as lightning_callbacks

    averaging = tuple(getattr(lightning_callbacks, n) for n in ("WeightAveraging", "StochasticWeightAveraging")
                      if hasattr(lightning_callbacks, n))
    for callback in trainer.callbacks:
        if isinstance(callback, averaging):
            raise ValueError(f"OrthogonalGrowth cannot grow the averaged copy of the module that"
                             f" {type(callback).__name__} keeps; drop that callback and use the module's own EMA"
                             " (e.g. module.ema_decay=0.999 with module=mdlm), which grows with the model")


def continue_schedule(old: Any, new: Any) -> None:
    """Make `new` (built at step 0 over the new optimizer) continue where `old` was, then apply its lrs."""
    optimizer = new.optimizer
    if len(getattr(old, "base_lrs", [])) == len(optimizer.param_groups):
        new.load_state_dict(old.state_dict())
        lrs = new.get_last_lr() if hasattr(new, "get_last_lr") else [g["lr"] for g in old.optimizer.param_groups]
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        return
    import warnings

    with warnings.catch_warnings():  # stepping without optimizer.step() is what fast-forwarding is
        warnings.simplefilter("ignore")
        for _ in range(int(getattr(old, "last_epoch", 0))):
            new.step()


def _shapes(module: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in module.named_parameters()]


def check_event(event: dict[str, Any], index: int) -> dict[str, Any]:
    """`event` reduced to `EVENT_KEYS`, or a ValueError naming the bad value (and the schedule index past the first)."""
    where = f"schedule[{index}]: " if index else ""
    if (event["at_step"] is None) == (event["at_epoch"] is None):
        raise ValueError(f"{where}set exactly one of at_step or at_epoch (got at_step={event['at_step']},"
                         f" at_epoch={event['at_epoch']})")
    for key in ("at_step", "at_epoch"):
        if event[key] is not None and (isinstance(event[key], bool) or int(event[key]) < 0):
            raise ValueError(f"{where}{key}={event[key]!r} must be an integer >= 0")
    for key in ("depth_factor", "width_factor"):
        if isinstance(event[key], bool) or not isinstance(event[key], int) or event[key] < 1:
            raise ValueError(f"{where}{key}={event[key]!r} must be an integer >= 1")
    if event["depth_method"] not in DEPTH_METHODS:
        raise ValueError(f"{where}depth_method={event['depth_method']!r} is invalid; valid: {', '.join(DEPTH_METHODS)}")
    if event["ignore_first"] < 0 or event["ignore_last"] < 0:
        raise ValueError(f"{where}ignore_first={event['ignore_first']}, ignore_last={event['ignore_last']}"
                         " must be >= 0")
    if not event["noise_alpha"] >= 0:
        raise ValueError(f"{where}noise_alpha={event['noise_alpha']!r} must be >= 0")
    return {k: event[k] for k in EVENT_KEYS}


def check_arity(fn: Callable[..., Any], n: int, what: str, valid: str) -> None:
    """TypeError unless `fn` can be called with `n` positional arguments (an nn.Module: its `forward`)."""
    target = fn.forward if isinstance(fn, nn.Module) else fn
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell, let the call decide
        return
    try:
        signature.bind(*([None] * n))
    except TypeError as err:
        raise TypeError(f"OrthogonalGrowth cannot measure the loss with {what}, whose signature is {signature}"
                        f" ({err}); it needs {valid}") from None
