"""OLion's parameter groups: per-parameter routing inside the user's groups, input checks, the AdamW branch and
the earlier layout.

`OLion.param_groups` holds exactly the groups the user passed; each has `orthogonal`, one bool per parameter (True:
the orthogonal branch, False: the AdamW branch). Earlier versions split every user group into up to three internal
groups (hidden / decay / no_decay, each with a bool `use_olion`); `old_layout_to_new` maps a state_dict saved that
way onto the current layout.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import torch
from torch import Tensor

from framework.optim.hybrid import Predicate, check_not_sharded, param_label
from framework.optim.ns_sharing import check_dtensor_layout

#: Frames in these folders are skipped when a warning points at the caller (torch, this package, Hydra's
#: instantiate, OmegaConf): the warning names the user's line that built the optimizer.
_INTERNAL_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
_INTERNAL_PACKAGES = ("hydra", "omegaconf", "functools")


def caller_stacklevel() -> int:
    """`stacklevel` for a `warnings.warn` made by this function's caller that names the first outside frame."""
    dirs = [d + os.sep for d in _INTERNAL_DIRS]
    for name in _INTERNAL_PACKAGES:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(path if name == "functools" else os.path.dirname(path) + os.sep)
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(tuple(dirs)):
        frame, level = frame.f_back, level + 1
    return level


def adamw_lr(group: dict[str, Any]) -> Any:
    """The AdamW branch's lr in `group`: `adamw_lr`·lr/`adamw_lr_base` (None: the group's lr)."""
    lr, base = group["lr"], group["adamw_lr_base"]
    if group["adamw_lr"] is None:
        return lr
    return group["adamw_lr"] * (lr / base) if base else group["adamw_lr"]


def adamw_update(p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
    """OLion's AdamW branch: bias-corrected AdamW with decoupled decay (≥2-D params only) at the group's AdamW
    lr, on `state` (the optimizer's state for p)."""
    lr = adamw_lr(group)
    wd = group["weight_decay"] if group["adamw_weight_decay"] is None else group["adamw_weight_decay"]
    wd = wd if p.ndim >= 2 else 0.0
    g = p.grad
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["step"] += 1
    b1, b2 = group["adamw_betas"]
    m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(group["adamw_eps"])
    p.mul_(1 - lr * wd)
    p.addcdiv_(m, denom, value=-lr / (1 - b1**t))


def check_tensor_lr(options: dict[str, Any]) -> None:
    """ValueError for a tensor `lr` / `adamw_lr` of more than one element, in torch.optim.AdamW's words."""
    for key in ("lr", "adamw_lr"):
        value = options.get(key)
        if isinstance(value, Tensor) and value.numel() != 1:
            raise ValueError(f"Tensor {key} must be 1-element")


def route(group: dict[str, Any], predicate: Predicate, edges: set[int] | frozenset[int] = frozenset()) -> list[bool]:
    """One bool per parameter of a (torch-normalised) group: True for the orthogonal branch; checks each one.
    `edges`: `id()`s of tensors that go to AdamW whatever the predicate says (a convnet's stem and classifier)."""
    names = group.get("param_names") or [""] * len(group["params"])
    explicit = group.get("use_olion")
    mask = []
    for name, p in zip(names, group["params"], strict=True):
        if p.is_complex():
            raise ValueError(
                f"OLion does not support complex parameters: {param_label(name, p)} has dtype {p.dtype}; valid: "
                "real floating-point parameters (keep the real and imaginary parts in a real parameter of shape "
                "(..., 2) and build the complex tensor with torch.view_as_complex in forward)"
            )
        check_not_sharded(name, p, "OLion")
        hidden = bool(explicit) if explicit is not None else id(p) not in edges and bool(predicate(name, p))
        if hidden:
            check_dtensor_layout(param_label(name, p), p)
            if p.ndim < 2:
                raise ValueError(
                    f"OLion needs a matrix but {param_label(name, p)} was routed to it (ndim {p.ndim}, "
                    "valid: ndim >= 2); fix the predicate or the group's use_olion"
                )
        mask.append(hidden)
    return mask


def _sub_groups(group: dict[str, Any]) -> list[tuple[bool, list[int]]]:
    """The old layout's internal groups of one user group: (use_olion, positions) for hidden, decay, no_decay."""
    params, mask = group["params"], group["orthogonal"]
    parts = (
        (True, [i for i, m in enumerate(mask) if m]),
        (False, [i for i, m in enumerate(mask) if not m and params[i].ndim >= 2]),
        (False, [i for i, m in enumerate(mask) if not m and params[i].ndim < 2]),
    )
    return [(flag, idx) for flag, idx in parts if idx]


def is_old_layout(state_dict: dict[str, Any]) -> bool:
    """True for a state_dict saved by OLion's earlier layout (internal groups with a bool `use_olion`)."""
    groups = state_dict.get("param_groups", [])
    return bool(groups) and all("orthogonal" not in g and isinstance(g.get("use_olion"), bool) for g in groups)


def old_layout_to_new(state_dict: dict[str, Any], groups: list[dict[str, Any]]) -> tuple[dict[str, Any], list[int]]:
    """(The state_dict in this layout, per user group the index of the old group whose hyperparameters it took)."""
    saved, used = state_dict["param_groups"], 0
    state: dict[Any, Any] = {k: v for k, v in state_dict["state"].items() if not isinstance(k, int)}
    packed, start, primary = [], 0, []
    for group in groups:
        subs = _sub_groups(group)
        olds = saved[used : used + len(subs)]
        layout = [(flag, len(idx)) for flag, idx in subs]
        if [(g["use_olion"], len(g["params"])) for g in olds] != layout:
            raise ValueError(
                "this OLion state_dict has the earlier layout (internal groups per branch) and does not match this "
                f"optimizer's routing: expected groups (use_olion, size) {layout}, found "
                f"{[(g['use_olion'], len(g['params'])) for g in olds]}; build the optimizer with the parameters, "
                "groups and predicate of the run that saved it"
            )
        first = next((i for i, g in enumerate(olds) if g["use_olion"]), 0)
        primary.append(min(used + first, len(saved) - 1))  # an empty group had no old group: take a neighbour's
        used += len(subs)
        for (_, idx), old in zip(subs, olds, strict=True):
            for pos, old_id in zip(idx, old["params"], strict=True):
                if old_id in state_dict["state"]:
                    state[start + pos] = state_dict["state"][old_id]
        packed.append(_merged_group(group, olds, start))
        start += len(group["params"])
    if used != len(saved):
        raise ValueError(f"this OLion state_dict has {len(saved)} internal groups; this optimizer's params make {used}")
    return {**state_dict, "state": state, "param_groups": packed}, primary


def remap_old_layout_scheduler(scheduler: Any) -> bool:
    """Cut a restored scheduler's per-old-group lists (base_lrs, _last_lr...) to one per user group; True if cut."""
    nested = getattr(scheduler, "_schedulers", None)  # SequentialLR / ChainedScheduler
    if nested:
        return any([remap_old_layout_scheduler(inner) for inner in nested])  # a list: remap every one
    primary, n_old = getattr(getattr(scheduler, "optimizer", None), "old_layout_groups", ([], 0))
    if not primary or n_old == len(primary):
        return False
    keys = [k for k, v in vars(scheduler).items() if isinstance(v, list) and len(v) == n_old]
    for key in keys:
        setattr(scheduler, key, [getattr(scheduler, key)[i] for i in primary])
    return bool(keys)


def _merged_group(group: dict[str, Any], olds: list[dict[str, Any]], start: int) -> dict[str, Any]:
    """A user group's saved hyperparameters: the old orthogonal group's (lr, betas, ...), else this run's."""
    merged = {k: v for k, v in group.items() if k != "params"}
    hidden = next((g for g in olds if g["use_olion"]), None)
    if hidden is not None:
        skip = ("params", "param_names", "use_olion", "adamw_weight_decay")  # this run resolves the AdamW decay
        merged.update({k: v for k, v in hidden.items() if k not in skip})
    elif olds and olds[0].get("adamw_lr", 0.0) is None:  # the AdamW lr was the group's lr
        merged.update({k: olds[0][k] for k in ("lr", "initial_lr", "adamw_lr") if k in olds[0]})
    merged["params"] = list(range(start, start + len(group["params"])))
    return merged


def check_init_args(distributed: str, ns_batch: int | None, ns_dtype: Any, modes: tuple[str, ...]) -> Any:
    """OLion's `distributed`, `ns_batch` and `ns_dtype` checked (ValueError naming the valid values); `ns_dtype` given
    as a torch dtype becomes its name ("bfloat16"): param groups hold plain values only, so torch.distributed's
    optimizer state dict (FSDP2's checkpoints) can flatten them; `group_ns_dtype` turns it back into the dtype."""
    if distributed not in modes:
        raise ValueError(f"distributed={distributed!r} is invalid: valid: {', '.join(modes)}")
    if ns_batch is not None and (isinstance(ns_batch, bool) or not isinstance(ns_batch, int) or ns_batch < 1):
        raise ValueError(f"ns_batch={ns_batch!r} is invalid: must be None (per device) or an integer >= 1")
    if isinstance(ns_dtype, torch.dtype):
        ns_dtype = str(ns_dtype).removeprefix("torch.")
    if isinstance(ns_dtype, str) and not isinstance(getattr(torch, ns_dtype, None), torch.dtype):
        raise ValueError(f"ns_dtype={ns_dtype!r} is invalid: use a torch dtype name, e.g. 'bfloat16'")
    return ns_dtype
