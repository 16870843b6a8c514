"""Growth events for `OrthogonalGrowth`: its arguments and schedule expanded into checked events, and recorded
events re-applied to a shape-only copy of a module (the module a checkpoint's weights load into)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from framework.grow.ops import DEPTH_METHODS, grow

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
    model_attr = record.get("model_attr", "model")
    model = getattr(clone, model_attr) if model_attr else clone
    for event in record.get("done", []):
        grow(model, depth_factor=event["depth_factor"], depth_method=event["depth_method"],
             ignore_first=event["ignore_first"], ignore_last=event["ignore_last"], width_factor=event["width_factor"],
             noise_alpha=0.0, layers_attr=record.get("layers_attr", "blocks"))
    return clone


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
