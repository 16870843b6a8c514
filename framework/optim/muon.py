"""A baseline for OLion: torch.optim.Muon + AdamW as one optimizer (OLion without its sign step is
`OLion(sign=False)`, registered as `ortho_momentum`).

It anchors the orthogonal branch to PyTorch's own Muon, and `tools/bench/optimizers.py` compares OLion with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from framework.optim.hybrid import (
    DEFAULT_ADAMW_LR,
    Predicate,
    check_options,
    edge_ids,
    is_expert_stack,
    is_hidden_matrix,
    materialise,
    normalize_param_groups,
    split_group,
)

MUON_ADJUST_LR_FNS = ("original", "match_rms_adamw", "spectral_unclamped")


class MuonAdamW(torch.optim.Optimizer):
    """torch.optim.Muon for hidden 2-D weights and torch.optim.AdamW for the rest, as ONE optimizer object.

    Routing is OLion's (`is_hidden_matrix` and a convnet's classifier, or `predicate`) restricted to 2-D, since
    torch.optim.Muon rejects other shapes: conv kernels go to AdamW. A stack of MoE experts (`is_expert_stack`:
    transformers 5's fused (E, out, in) `gate_up_proj` / `down_proj`) gets torch.optim.Muon's update per expert,
    batched: the same momentum, Newton–Schulz (`newton_schulz5`, bf16) and lr adjustment on each (out, in) matrix.
    The AdamW branch runs at `adamw_lr`, a fixed
    `DEFAULT_ADAMW_LR` unless given (`adamw_lr=None`: each group's `lr`). `param_groups` is the union of the two
    inner optimizers' groups (the same dicts, each tagged `use_muon`), so LR schedulers and Lightning checkpoints
    see one optimizer.
    `adjust_lr_fn="match_rms_adamw"` scales Muon updates to 0.2·sqrt(max dim), AdamW's steady-state update RMS;
    that does not make `lr` AdamW's lr (AdamW's early steps are larger): the char_lm sweep in
    `tools/bench/optimizers.py` finds Muon's best lr well above AdamW's, as for OLion.
    1-D params (norms, biases) are never decayed.

    Args:
        params: parameters, named parameters or groups to optimise; supplied by the framework at build time.
        lr: step size of the Muon branch, before the `adjust_lr_fn` scaling.
        weight_decay: decoupled weight decay of the Muon branch (and of AdamW's unless `adamw_weight_decay` is set).
        momentum: Muon's momentum coefficient, in [0, 1).
        nesterov: use Nesterov momentum in the Muon branch.
        ns_steps: Newton-Schulz iterations that orthogonalise each Muon update.
        eps: lower bound on the update norm that Newton-Schulz divides by, to avoid dividing by zero.
        adjust_lr_fn: how lr scales with matrix shape: "original" (None too), "match_rms_adamw" or "spectral_unclamped".
        adamw_lr: step size of the AdamW branch; None uses each group's `lr`.
        adamw_betas: (β1, β2) of the AdamW branch.
        adamw_eps: ε of the AdamW branch's denominator.
        adamw_weight_decay: weight decay of the AdamW branch's ≥2-D params; None reuses `weight_decay`.
        predicate: `(name, param) -> bool` choosing Muon params (2-D or expert stacks only); None: default routing.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 3e-4,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        eps: float = 1e-7,
        adjust_lr_fn: str | None = "match_rms_adamw",
        adamw_lr: float | None = DEFAULT_ADAMW_LR,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-10,
        adamw_weight_decay: float | None = None,
        predicate: Predicate | None = None,
    ) -> None:
        if adjust_lr_fn is not None and adjust_lr_fn not in MUON_ADJUST_LR_FNS:
            raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r} is invalid: valid: None, {MUON_ADJUST_LR_FNS}")
        self.hparams = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            eps=eps,
            adjust_lr_fn=adjust_lr_fn,
            adamw_lr=adamw_lr,
            adamw_betas=tuple(adamw_betas),
            adamw_eps=adamw_eps,
            adamw_weight_decay=weight_decay if adamw_weight_decay is None else adamw_weight_decay,
        )
        check_options(self.hparams)
        user_predicate = predicate or is_hidden_matrix
        groups = normalize_param_groups(materialise(params))
        edges = edge_ids(groups) if predicate is None else set()  # a convnet's classifier, among these params only
        self.predicate: Callable[[str, Tensor], bool] = (
            lambda n, p: (p.ndim == 2 or is_expert_stack(n, p)) and id(p) not in edges and user_predicate(n, p))
        self._muon: torch.optim.Muon | None = None
        self._adamw: torch.optim.AdamW | None = None
        # empty defaults: the inner optimizers own their groups' keys, the wrapper adds none
        super().__init__(groups, {})
        edges.clear()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Route a group (per-group `lr`, `weight_decay`, `adamw_*` overrides allowed) to Muon and AdamW."""
        h = {**self.hparams, **{k: v for k, v in param_group.items() if k not in ("params", "param_names")}}
        for kind, sub in _with_expert_stacks(split_group(param_group, self.predicate)):
            if kind == "experts":  # our batched Muon (torch.optim.Muon takes 2-D only)
                sub.update(use_muon=True, expert_stack=True, lr=h["lr"], weight_decay=h["weight_decay"],
                           momentum=h["momentum"], nesterov=h["nesterov"], ns_steps=h["ns_steps"], eps=h["eps"],
                           adjust_lr_fn=h["adjust_lr_fn"])
            elif kind == "hidden":
                sub.update(
                    use_muon=True,
                    lr=h["lr"],
                    weight_decay=h["weight_decay"],
                    momentum=h["momentum"],
                    nesterov=h["nesterov"],
                    ns_steps=h["ns_steps"],
                    eps=h["eps"],
                    adjust_lr_fn=h["adjust_lr_fn"],
                )
                if self._muon is None:
                    self._muon = torch.optim.Muon([sub])
                else:
                    self._muon.add_param_group(sub)
            else:
                sub.update(
                    use_muon=False,
                    lr=h["lr"] if h["adamw_lr"] is None else h["adamw_lr"],
                    betas=h["adamw_betas"],
                    eps=h["adamw_eps"],
                    weight_decay=h["adamw_weight_decay"] if kind == "decay" else 0.0,
                )
                if self._adamw is None:
                    self._adamw = torch.optim.AdamW([sub])
                else:
                    self._adamw.add_param_group(sub)
            super().add_param_group(sub)
        self._link()

    def _link(self) -> None:
        """Point the inner optimizers at the wrapper's group dicts and its one state dict."""
        for inner, flag in ((self._muon, True), (self._adamw, False)):
            if inner is not None:
                inner.param_groups = [g for g in self.param_groups
                                      if bool(g["use_muon"]) == flag and not g.get("expert_stack")]
                inner.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as one optimizer, then re-link the inner optimizers to the new group dicts and state."""
        super().load_state_dict(state_dict)
        self._link()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Muon step on hidden matrices, then AdamW step on the rest."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for inner in (self._muon, self._adamw):
            if inner is not None:
                inner.step()
        for group in self.param_groups:
            if group.get("expert_stack"):
                self._expert_step(group)
        return loss

    @torch.no_grad()
    def _expert_step(self, group: dict[str, Any]) -> None:
        """torch.optim.Muon's update on each expert of (E, out, in) stacks: momentum, Nesterov, NS5 in bf16 (batched
        over the experts), the lr adjusted for one expert's (out, in), decoupled decay."""
        from torch.optim._muon import _adjust_lr

        from framework.optim.newton_schulz import newton_schulz5

        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - group["momentum"])
            update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
            q = newton_schulz5(update, steps=group["ns_steps"], eps=group["eps"], dtype=torch.bfloat16)
            lr = float(group["lr"])
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(q.to(p.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape[1:]))


def _with_expert_stacks(parts: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """`split_group`'s sub-groups with the hidden one cut in two: 2-D matrices ("hidden", torch.optim.Muon) and
    stacks of MoE experts ("experts")."""
    out = []
    for kind, sub in parts.items():
        if kind != "hidden":
            out.append((kind, sub))
            continue
        names = sub.get("param_names") or [""] * len(sub["params"])
        for label, keep in (("hidden", False), ("experts", True)):
            idx = [i for i, (n, p) in enumerate(zip(names, sub["params"], strict=True))
                   if is_expert_stack(n, p) == keep]
            if idx:
                piece = {"params": [sub["params"][i] for i in idx]}
                if "param_names" in sub:
                    piece["param_names"] = [names[i] for i in idx]
                out.append((label, piece))
    return out
