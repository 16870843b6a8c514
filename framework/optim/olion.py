"""OLion (Orthogonal Lion, arXiv 2602.01105) for hidden matrices, with an internal AdamW for everything else.

Spec: shared/specs/olion_growth.md §1.2 (update rule), §1.4 (defaults), §1.5 (routing, conv, distributed).
One optimizer object, so Lightning checkpoints it as one state and LR schedulers see every group's `lr`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from framework.optim.hybrid import (
    Predicate,
    check_not_sharded,
    check_options,
    is_hidden_matrix,
    normalize_param_groups,
    param_label,
    split_group,
)
from framework.optim.newton_schulz import newton_schulz5
from framework.optim.ns_sharing import (
    DISTRIBUTED_MODES,
    assign_owners,
    broadcast_results,
    check_dtensor_layout,
    gather_full,
    is_dtensor,
    make_units,
    ns_cost,
    process_group,
    shard_of,
)

#: Same-shape matrices per batched Newton–Schulz call when `ns_batch` is None, on CUDA (on CPU: 1, the loop).
DEFAULT_NS_BATCH_CUDA = 8


class OLion(torch.optim.Optimizer):
    """OLion: W ← W(1−ηλ) − η·s·sign(NS5(c)), c a Nesterov mix of g and the EMA m (§1.2); AdamW for the rest.

    `params`: (name, Parameter) pairs (preferred: `model.named_parameters()`), plain tensors, or group dicts
    (each is routed, unless it sets "use_olion" itself). Plain tensors (`model.parameters()`) carry no names,
    so the default routing sees shapes only and sends EVERY ≥2-D tensor, the embeddings and the output head
    included, to the orthogonal branch; the optimizer warns once when that happens. Pass names to route them
    to AdamW. Each resulting group has `use_olion`; in AdamW groups `lr`, `betas`, `eps`,
    `weight_decay` hold the AdamW values (`adamw_*`; `adamw_lr` and `adamw_weight_decay` default to `lr` and
    `weight_decay`). The AdamW branch decays ≥2-D params (embeddings, heads) only, never norms or biases.

    β1 (`betas[0]`) is the interpolation weight and β2 the EMA decay, as in the authors' code:
    m ← β2·m + (1−β2)·g first, then c = (1−β1)·g + β1·m with the new m (`pre_update_momentum=True`: the old
    m, Lion's order; `nesterov=False`: c = m). Scales use the 2-D view (out, in·k…): `use_scale` sets
    ‖S‖_F = sqrt(min dim), `rms_scale` multiplies by 0.2·sqrt(max dim), so by default every entry moves by
    exactly ±0.2·lr. `sign=False` drops the sign step (the NS-only ablation, registered as `ortho_momentum`).

    The lr to start from is NOT AdamW's lr: AdamW's first steps move entries by up to lr, OLion's by 0.2·lr, so at
    AdamW's lr OLion trains several times slower. `tools/bench/optimizers.py` (table (e) in BENCHMARKS.md) measures
    the lr ratio OLion/AdamW at which OLion first matches AdamW's best result on each workload: start from AdamW's
    best lr times that ratio (8 on the new-user MLP, 3.33 on char_lm at 300 steps) and sweep around it.

    `ns_dtype` (a dtype or its name) sets the Newton–Schulz dtype; None means bf16 on CUDA and fp32 elsewhere.
    `ns_batch` stacks up to that many same-shape matrices into one batched NS call (1 = a per-matrix loop);
    None means 1 on CPU (batching measured slower there) and 8 on CUDA. Distributed (torch.distributed
    initialised, world size > 1): `distributed="round_robin"` gives each NS unit an owner rank, balanced by cost
    m·n·min(m, n); owners broadcast their results, so every rank applies the same update from the averaged grads,
    bit for bit what one process computes; `"redundant"` has every rank compute every NS (also right for
    unsynchronised per-rank models). Plain tensors are assumed replicated (DDP). FSDP2 (`fully_shard`) DTensor
    matrices on a 1-D mesh are gathered whole for NS; each rank applies its shard of the update, and the momentum
    stays sharded. Params whose grad is None are skipped (every rank must skip the same ones).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.95, 0.98),
        weight_decay: float = 0.1,
        ns_steps: int = 5,
        ns_dtype: torch.dtype | str | None = None,
        use_scale: bool = True,
        rms_scale: bool = True,
        nesterov: bool = True,
        pre_update_momentum: bool = False,
        sign: bool = True,
        eps: float = 1e-8,
        adamw_lr: float | None = None,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-10,
        adamw_weight_decay: float | None = None,
        predicate: Predicate | None = None,
        ns_batch: int | None = None,
        distributed: str = "round_robin",
    ) -> None:
        if distributed not in DISTRIBUTED_MODES:
            raise ValueError(f"distributed={distributed!r} is invalid: valid: {', '.join(DISTRIBUTED_MODES)}")
        if ns_batch is not None and (isinstance(ns_batch, bool) or not isinstance(ns_batch, int) or ns_batch < 1):
            raise ValueError(f"ns_batch={ns_batch!r} is invalid: must be None (per device) or an integer >= 1")
        self.distributed = distributed
        if isinstance(ns_dtype, str):  # "bfloat16" / "float32", e.g. from a Hydra override
            if not isinstance(getattr(torch, ns_dtype, None), torch.dtype):
                raise ValueError(f"ns_dtype={ns_dtype!r} is invalid: use a torch dtype name, e.g. 'bfloat16'")
            ns_dtype = getattr(torch, ns_dtype)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            weight_decay=weight_decay,
            ns_steps=ns_steps,
            ns_dtype=ns_dtype,
            use_scale=use_scale,
            rms_scale=rms_scale,
            nesterov=nesterov,
            pre_update_momentum=pre_update_momentum,
            sign=sign,
            eps=eps,
            adamw_lr=adamw_lr,
            adamw_betas=tuple(adamw_betas),
            adamw_eps=adamw_eps,
            adamw_weight_decay=adamw_weight_decay,
            ns_batch=ns_batch,
        )
        check_options(defaults)
        self.predicate: Callable[[str, Tensor], bool] = predicate or is_hidden_matrix
        self._warned_unnamed = False
        super().__init__(normalize_param_groups(params), defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Route `param_group` into an OLion group and up to two AdamW groups (decay / no decay); add them."""
        overrides = {k: v for k, v in param_group.items() if k not in ("params", "param_names")}
        opts = {**self.defaults, **overrides}
        check_options(opts)
        explicit = opts.pop("use_olion", None)
        predicate = self.predicate if explicit is None else (lambda name, p: bool(explicit))
        subgroups = split_group(param_group, predicate)
        hidden = subgroups.get("hidden", {})
        if hidden and "param_names" not in hidden and explicit is None and self.predicate is is_hidden_matrix:
            self._warn_unnamed(hidden["params"])
        for kind, sub in subgroups.items():
            self._check_params(sub, hidden=kind == "hidden")
            if kind == "hidden":
                sub.update(opts, use_olion=True)
            else:
                wd = opts["adamw_weight_decay"]
                if wd is None or ("weight_decay" in overrides and "adamw_weight_decay" not in overrides):
                    wd = opts["weight_decay"]
                lr = opts["lr"] if opts["adamw_lr"] is None else opts["adamw_lr"]
                sub.update(
                    opts,
                    lr=lr,
                    betas=opts["adamw_betas"],
                    eps=opts["adamw_eps"],
                    use_olion=False,
                    weight_decay=wd if kind == "decay" else 0.0,
                )
            super().add_param_group(sub)

    def _warn_unnamed(self, params: list[Tensor]) -> None:
        """Once per optimizer: unnamed ≥2-D tensors were routed by shape alone (embeddings/heads included)."""
        if self._warned_unnamed:
            return
        self._warned_unnamed = True
        shapes = ", ".join(str(tuple(p.shape)) for p in params[:4]) + (", ..." if len(params) > 4 else "")
        warnings.warn(
            f"{type(self).__name__} got parameters without names, so it routes them by shape alone: every tensor"
            f" with ndim >= 2 ({len(params)} here: {shapes}), embeddings and the output head included, goes to the"
            " orthogonal branch. Pass model.named_parameters() (or (name, tensor) pairs) so embeddings, heads and"
            " norms go to AdamW; or pass a predicate, or groups with use_olion, to route explicitly.",
            UserWarning,
            stacklevel=5,  # the caller of OLion(...)
        )

    @staticmethod
    def _check_params(group: dict[str, Any], hidden: bool) -> None:
        names = group.get("param_names") or [""] * len(group["params"])
        for name, p in zip(names, group["params"], strict=True):
            check_not_sharded(name, p, "OLion")
            if hidden:
                check_dtensor_layout(param_label(name, p), p)
            if hidden and p.ndim < 2:
                raise ValueError(
                    f"OLion needs a matrix but {param_label(name, p)} was routed to it (ndim {p.ndim}, "
                    "valid: ndim >= 2); fix the predicate or the group's use_olion"
                )

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One OLion/AdamW step over all groups (§1.2; AdamW: bias-corrected, decoupled decay)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        hidden: list[tuple[Tensor, dict[str, Any]]] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("OLion does not support sparse gradients")
                if group["use_olion"]:
                    hidden.append((p, group))
                else:
                    self._adamw_update(p, group)
        if hidden:
            self._olion_step(hidden)
        return loss

    def _olion_step(self, hidden: list[tuple[Tensor, dict[str, Any]]]) -> None:
        """Momentum on every rank, NS5 by each unit's owner (or by every rank), then every rank applies (§1.2)."""
        params = [p for p, _ in hidden]
        group_pg, rank, world = process_group(params)
        dirs = [self._momentum_direction(p, g) for p, g in hidden]  # local shards for DTensors
        shapes = [torch.Size((p.shape[0], p.numel() // p.shape[0] if p.shape[0] else 0)) for p in params]  # 2-D
        ns_dtypes, keys, batch = [], [], []
        for (_, g), c, shape in zip(hidden, dirs, shapes, strict=True):
            ns_dtypes.append(g["ns_dtype"] or (torch.bfloat16 if c.is_cuda else torch.float32))
            keys.append((shape, c.dtype, c.device, ns_dtypes[-1], g["ns_steps"], g["sign"]))
            batch.append(g["ns_batch"] or (DEFAULT_NS_BATCH_CUDA if c.is_cuda else 1))
        units = make_units(keys, batch)
        share = self.distributed == "round_robin" and world > 1
        owners = assign_owners([sum(ns_cost(shapes[i]) for i in u) for u in units], world) if share else None
        if any(is_dtensor(p) for p in params):  # whole matrices, on their owner only (everywhere if redundant)
            dst = None
            if owners is not None:
                dst = [0] * len(params)
                for unit, owner in zip(units, owners, strict=True):
                    for i in unit:
                        dst[i] = owner
            dirs = gather_full(dirs, params, group_pg, world, dst)
        results: list[Tensor | None] = [None] * len(hidden)
        for k, unit in enumerate(units):
            if owners is not None and owners[k] != rank:
                continue
            g = hidden[unit[0]][1]
            mats = [dirs[i].reshape(shapes[i]) for i in unit]
            x = mats[0] if len(unit) == 1 else torch.stack(mats)
            q = newton_schulz5(x, steps=g["ns_steps"], dtype=ns_dtypes[unit[0]])
            q = torch.sign(q) if g["sign"] else q  # sign() is exact in any dtype
            for j, i in enumerate(unit):
                results[i] = q if len(unit) == 1 else q[j]
        if owners is not None:
            wire = [torch.int8 if g["sign"] else d for (_, g), d in zip(hidden, ns_dtypes, strict=True)]
            broadcast_results(units, owners, results, shapes, wire, dirs[0].device, group_pg, rank, world)
        for (p, g), q in zip(hidden, results, strict=True):
            self._apply(p, g, q, rank, world)  # type: ignore[arg-type]

    def _momentum_direction(self, p: Tensor, group: dict[str, Any]) -> Tensor:
        """Update the EMA m and return c, the Nesterov mix of g and m (this rank's shard for a DTensor)."""
        g, state = p.grad, self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        m = state["momentum_buffer"]
        b1, b2 = group["betas"]
        c = g.lerp(m, b1) if group["nesterov"] and group["pre_update_momentum"] else None
        m.lerp_(g, 1 - b2)
        if c is None:
            c = g.lerp(m, b1) if group["nesterov"] else m
        return c.to_local() if is_dtensor(c) else c

    @staticmethod
    def _apply(p: Tensor, group: dict[str, Any], q: Tensor, rank: int, world: int) -> None:
        """W ← W(1−ηλ) − η·scale·q, q the (signed) NS5 output of the full matrix; a DTensor keeps its shard."""
        d_out, d_in = q.shape
        # scaling happens in ≥fp32 so entries are 0.2·lr to fp32 precision
        u = q.to(torch.promote_types(p.dtype, torch.float32))
        scale: Tensor | float = 1.0
        if group["use_scale"]:
            scale = math.sqrt(min(d_out, d_in)) / (u.norm() + group["eps"])
        if group["rms_scale"]:
            scale = scale * (0.2 * math.sqrt(max(d_out, d_in)))
        u = u * scale
        local = p.to_local() if is_dtensor(p) else p
        local.mul_(1 - group["lr"] * group["weight_decay"])
        local.add_(shard_of(u.reshape(p.shape), p, rank, world), alpha=-group["lr"])

    def _adamw_update(self, p: Tensor, group: dict[str, Any]) -> None:
        g, state = p.grad, self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        b1, b2 = group["betas"]
        m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(group["eps"])
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.addcdiv_(m, denom, value=-group["lr"] / (1 - b1**t))
