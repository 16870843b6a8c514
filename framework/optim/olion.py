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
    ±0.2·lr, the same RMS as AdamW, and `lr` is meant to be the AdamW lr. `sign=False` drops the sign step
    (the NS-only ablation, registered as `ortho_momentum`).

    `ns_dtype` (a dtype or its name) sets the Newton–Schulz dtype; None means bf16 on CUDA and fp32 elsewhere
    (CPUs without bf16 units run bf16 matmuls 30–70× slower). Under DDP every rank computes the same update
    from the already-averaged grads; sharded (FSDP/DTensor) hidden matrices are refused. Params whose grad is
    None are skipped.
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
    ) -> None:
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
            check_not_sharded(name, p, "OLion", hidden)
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
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("OLion does not support sparse gradients")
                if group["use_olion"]:
                    self._olion_update(p, group)
                else:
                    self._adamw_update(p, group)
        return loss

    def _olion_update(self, p: Tensor, group: dict[str, Any]) -> None:
        g, state = p.grad, self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        m = state["momentum_buffer"]
        b1, b2 = group["betas"]
        c = g.lerp(m, b1) if group["nesterov"] and group["pre_update_momentum"] else None
        m.lerp_(g, 1 - b2)
        if c is None:
            c = g.lerp(m, b1) if group["nesterov"] else m
        c2 = c.reshape(c.shape[0], -1)
        d_out, d_in = c2.shape
        ns_dtype = group["ns_dtype"] or (torch.bfloat16 if c2.is_cuda else torch.float32)
        q = newton_schulz5(c2, steps=group["ns_steps"], dtype=ns_dtype)
        # sign() is exact in any dtype; scaling happens in ≥fp32 so entries are 0.2·lr to fp32 precision
        u = (torch.sign(q) if group["sign"] else q).to(torch.promote_types(p.dtype, torch.float32))
        scale: Tensor | float = 1.0
        if group["use_scale"]:
            scale = math.sqrt(min(d_out, d_in)) / (u.norm() + group["eps"])
        if group["rms_scale"]:
            scale = scale * (0.2 * math.sqrt(max(d_out, d_in)))
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(u.mul_(scale).reshape(p.shape), alpha=-group["lr"])

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
