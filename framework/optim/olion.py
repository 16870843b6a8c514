"""OLion (Orthogonal Lion, arXiv 2602.01105) for hidden matrices, with an internal AdamW for everything else.

docs/olion.md states the update rule, the defaults, the routing, the conv view and the distributed modes.
One optimizer object, so Lightning checkpoints it as one state and LR schedulers see every group's `lr`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from framework.optim.hybrid import (
    DEFAULT_ADAMW_LR,
    Predicate,
    check_options,
    edge_ids,
    expert_stack_flags,
    is_hidden_matrix,
    materialise,
)
from framework.optim.newton_schulz import Workspace, orthogonalize, update_scale, uses_gram
from framework.optim.ns_dtype import AUTO_KEY, group_ns_dtype
from framework.optim.ns_sharing import (
    DISTRIBUTED_MODES,
    assign_owners,
    broadcast_results,
    gather_full,
    is_dtensor,
    make_units,
    ns_cost,
    process_group,
    shard_of,
)
from framework.optim.olion_groups import (
    adamw_update,
    caller_stacklevel,
    check_init_args,
    check_tensor_lr,
    is_old_layout,
    old_layout_to_new,
    route,
)

#: Same-shape matrices per batched Newton–Schulz call when `ns_batch` is None, on CUDA (on CPU: 1, the loop).
DEFAULT_NS_BATCH_CUDA = 8


class OLion(torch.optim.Optimizer):
    """OLion: W ← W(1−ηλ) − η·s·sign(NS5(c)), c a Nesterov mix of g and the EMA m; AdamW for the rest.

    Routing: `is_hidden_matrix` on each name (embeddings, tokens, norms, biases, stems, heads go to AdamW) and, over
    the named parameters given at construction, a convnet's stem and classifier to AdamW (`convnet_edges`). Plain
    tensors (`model.parameters()`) carry no names, so EVERY ≥2-D tensor, embeddings and head included, goes to the
    orthogonal branch (warned once): pass `model.named_parameters()`. A group dict setting "use_olion" is not routed.
    `param_groups` holds exactly the groups passed; each group's `orthogonal` lists one bool per parameter. The AdamW
    branch's lr is `adamw_lr`·lr/`adamw_lr_base` (the group's lr at construction), so a schedule on `lr` scales both
    branches alike; it decays ≥2-D params only, never norms or biases. Complex parameters are refused. A scheduler's
    `cycle_momentum` cycles `betas[0]`, not `adamw_betas`.

    Momentum, as in the authors' code: m ← β2·m + (1−β2)·g, then c = (1−β1)·g + β1·m with the new m. Scales use the
    2-D view (out, in·k…); by default the update's RMS is exactly 0.2·lr. Each entry moves by ±0.2·lr·sqrt(out·in/nnz)
    or not at all, nnz the nonzero count of sign(NS5(c)): ±0.2·lr when no sign is 0, larger when c has zero rows or
    columns (25% dead inputs give 0.2·lr·sqrt(4/3)).

    The lr to start from is NOT AdamW's lr: OLion moves entries by 0.2·lr (RMS), so at AdamW's lr it trains several
    times slower. `tools/bench/optimizers.py` (BENCHMARKS.md tables (c), (e), (f)) measures the lr ratio OLion/AdamW
    at which OLion matches AdamW's best, and the AdamW branch's best lr: start there and sweep.
    FSDP2 (`fully_shard`) DTensor matrices on a 1-D mesh are gathered whole for NS; each rank applies its shard of
    the update, and the momentum stays sharded. Params whose grad is None are skipped (every rank must skip the same).

    Args:
        params: named parameters, plain tensors or group dicts to optimise; supplied by the framework at build time.
        lr: step size of the orthogonal branch (the AdamW branch's is `adamw_lr`).
        betas: (β1, β2): β1 the interpolation weight of gradient and momentum, β2 the momentum's EMA decay.
        weight_decay: decoupled weight decay (W ← W(1−ηλ)) of the orthogonal branch; 0 turns it off.
        ns_steps: Newton-Schulz iterations per update.
        ns_dtype: dtype (or its name) of the Newton-Schulz math; None: bf16 where the device has bf16 matmul, else fp32.
            The automatic choice is kept in the group's `ns_dtype_auto`, so a resumed run keeps it.
        ns_form: "auto", "standard" or "gram": "auto" uses the Gram-matrix iteration for matrices ≥ 2x as long as wide.
        use_scale: rescale the (signed) NS output to Frobenius norm sqrt(min dim).
        rms_scale: multiply the update by 0.2·sqrt(max dim), so its RMS is 0.2·lr with `use_scale`.
        nesterov: update along the Nesterov mix c = (1−β1)·g + β1·m; False updates along m itself.
        pre_update_momentum: mix the gradient with the momentum before this step's EMA update (Lion's order).
        sign: take the sign of the orthogonalised update; False is the NS-only ablation (`ortho_momentum`).
        eps: added to the update's norm in the `use_scale` division, to avoid dividing by zero.
        adamw_lr: step size of the AdamW branch, scaled by the same schedule as `lr`; None: the group's own lr.
        adamw_betas: (β1, β2) of the AdamW branch.
        adamw_eps: ε of the AdamW branch's denominator.
        adamw_weight_decay: weight decay of the AdamW branch's ≥2-D params; None reuses `weight_decay`.
        predicate: `(name, param) -> bool`, True for the orthogonal branch; None: the default routing above.
        ns_batch: same-shape matrices stacked per batched NS call (1: a per-matrix loop); None: 1 on CPU, 8 on CUDA.
        distributed: with world size > 1, "round_robin" (each NS on one owner rank, then broadcast) or "redundant".
            Round-robin balances owners by cost m·n·min(m, n) and gives bit-identical updates on every rank;
            "redundant" has every rank compute every NS (also right for unsynchronised per-rank models).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.95, 0.98),
        weight_decay: float = 0.1,
        ns_steps: int = 5,
        ns_dtype: torch.dtype | str | None = None,
        ns_form: str = "auto",
        use_scale: bool = True,
        rms_scale: bool = True,
        nesterov: bool = True,
        pre_update_momentum: bool = False,
        sign: bool = True,
        eps: float = 1e-8,
        adamw_lr: float | None = DEFAULT_ADAMW_LR,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-10,
        adamw_weight_decay: float | None = None,
        predicate: Predicate | None = None,
        ns_batch: int | None = None,
        distributed: str = "round_robin",
    ) -> None:
        ns_dtype = check_init_args(distributed, ns_batch, ns_dtype, DISTRIBUTED_MODES)
        self.distributed = distributed
        defaults = dict(
            lr=lr, betas=tuple(betas), weight_decay=weight_decay, ns_steps=ns_steps, ns_dtype=ns_dtype,
            ns_form=ns_form, use_scale=use_scale, rms_scale=rms_scale, nesterov=nesterov,
            pre_update_momentum=pre_update_momentum, sign=sign, eps=eps, adamw_lr=adamw_lr,
            adamw_betas=tuple(adamw_betas), adamw_eps=adamw_eps, adamw_weight_decay=adamw_weight_decay,
            ns_batch=ns_batch,
        )
        check_tensor_lr(defaults)
        check_options(defaults)
        self.predicate: Callable[[str, Tensor], bool] = predicate or is_hidden_matrix
        self._warned_unnamed = False
        self._workspace = Workspace()  # CPU buffers reused every step: `_momentum_direction`, NS
        params = materialise(params)
        # a convnet's stem and classifier, found among all the params given now (later groups: names only)
        self._edges = edge_ids(params) if predicate is None and isinstance(params, list) else set()
        super().__init__(params, defaults)
        self._edges = set()

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus OLion's own settings, so deepcopy and pickle keep a working optimizer."""
        return {
            **super().__getstate__(),
            "distributed": self.distributed,
            "predicate": self.predicate,
            "_warned_unnamed": self._warned_unnamed,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled OLion (one pickled without OLion's settings gets the defaults)."""
        super().__setstate__(state)
        self.__dict__.setdefault("distributed", "round_robin")
        self.__dict__.setdefault("predicate", is_hidden_matrix)
        self.__dict__.setdefault("_warned_unnamed", False)
        self.__dict__.setdefault("_workspace", Workspace())

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add one group as it is (torch's checks), with `orthogonal`: each parameter's branch (its routing)."""
        group = {k: v for k, v in param_group.items() if k != "orthogonal"}
        if "weight_decay" in group and "adamw_weight_decay" not in group:
            group["adamw_weight_decay"] = None  # a group's weight_decay is its AdamW decay too, unless it sets both
        overrides = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        check_tensor_lr(overrides)
        check_options({**self.defaults, **overrides})
        super().add_param_group(group)
        group = self.param_groups[-1]
        try:
            group["orthogonal"] = route(group, self.predicate, getattr(self, "_edges", set()))
        except (ValueError, NotImplementedError):
            self.param_groups.pop()
            raise
        group["expert_stack"] = expert_stack_flags(group)  # MoE experts (E, out, in): NS per expert
        lr = group["lr"]  # a tensor lr is updated in place by schedulers: keep its value, not the tensor
        group["adamw_lr_base"] = lr.item() if isinstance(lr, Tensor) else lr
        if any(group["orthogonal"]) and "param_names" not in group and group.get("use_olion") is None:
            if self.predicate is is_hidden_matrix:
                self._warn_unnamed([p for p, m in zip(group["params"], group["orthogonal"], strict=True) if m])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state_dict; one in the earlier layout (internal groups per branch) is mapped onto this one first."""
        if is_old_layout(state_dict):
            n_old = len(state_dict["param_groups"])
            state_dict, primary = old_layout_to_new(state_dict, self.param_groups)
            self.old_layout_groups = (primary, n_old)
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # saved before ns_form existed: NS as it ran then (fp32 unless on CUDA)
            if "ns_form" not in group:
                group["ns_form"] = "standard"
                if group["ns_dtype"] is None and AUTO_KEY not in group:
                    group[AUTO_KEY] = "bfloat16" if group["params"] and group["params"][0].is_cuda else "float32"

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
            " norms go to AdamW: in a LightningModule, self.named_parameters() instead of self.parameters(). Or"
            " pass a predicate, or groups with use_olion, to route explicitly.",
            UserWarning,
            stacklevel=caller_stacklevel(),  # the user's line that built the optimizer
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One OLion/AdamW step over all groups (AdamW: bias-corrected, decoupled decay)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        hidden: list[tuple[Tensor, dict[str, Any]]] = []
        stacked: list[bool] = []
        for group in self.param_groups:
            if "expert_stack" not in group:  # a state saved before expert stacks were known: by name, as now
                group["expert_stack"] = expert_stack_flags(group)
            for p, orthogonal, stack in zip(group["params"], group["orthogonal"], group["expert_stack"], strict=True):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("OLion does not support sparse gradients")
                if orthogonal:
                    hidden.append((p, group))
                    stacked.append(stack)
                else:
                    adamw_update(p, group, self.state[p])
        if hidden:
            self._olion_step(hidden, stacked)
        return loss

    def _olion_step(self, hidden: list[tuple[Tensor, dict[str, Any]]], stacked: list[bool] | None = None) -> None:
        """Momentum on every rank, NS5 by each unit's owner (or by every rank), then every rank applies. A stack of
        MoE experts (`stacked`) keeps its 3-D shape: one batched NS5 over its experts, each scaled on its own.

        Without DTensors a unit's momentum direction is made just before its NS and dropped after it (and only its
        momentum is updated where another rank owns it), so the directions never all live at once."""
        params = [p for p, _ in hidden]
        group_pg, rank, world = process_group(params)
        stacked = stacked or [False] * len(params)
        shapes = [p.shape if stack else torch.Size((p.shape[0], p.numel() // p.shape[0] if p.shape[0] else 0))
                  for p, stack in zip(params, stacked, strict=True)]  # 2-D views; expert stacks (E, out, in)
        ns_dtypes, keys, batch = [], [], []
        for (p, g), shape in zip(hidden, shapes, strict=True):
            ns_dtypes.append(group_ns_dtype(g, p.grad.device, group_pg, world))
            keys.append((shape, p.grad.dtype, p.grad.device, ns_dtypes[-1], g["ns_steps"], g["ns_form"], g["sign"]))
            batch.append(g["ns_batch"] or (DEFAULT_NS_BATCH_CUDA if p.grad.is_cuda else 1))
        units = make_units(keys, batch)
        share = self.distributed == "round_robin" and world > 1
        owners = None
        if share:
            costs = [sum(ns_cost(shapes[i], uses_gram(shapes[i], hidden[i][1]["ns_form"])) for i in u) for u in units]
            owners = assign_owners(costs, world)
        dirs: list[Tensor | None] = [None] * len(hidden)
        if any(is_dtensor(p) for p in params):  # whole matrices, on their owner only (everywhere if redundant)
            dirs = [self._momentum_direction(p, g) for p, g in hidden]  # local shards
            dst = None
            if owners is not None:
                dst = [0] * len(params)
                for unit, owner in zip(units, owners, strict=True):
                    for i in unit:
                        dst[i] = owner
            dirs = gather_full(dirs, params, group_pg, world, dst)
        results: list[Tensor | None] = [None] * len(hidden)
        wire = [torch.int8 if g["sign"] else d for (_, g), d in zip(hidden, ns_dtypes, strict=True)]
        for k, unit in enumerate(units):
            mine = owners is None or owners[k] == rank
            for i in unit:
                if dirs[i] is None and not is_dtensor(params[i]):
                    dirs[i] = self._momentum_direction(*hidden[i], need=mine, slot=unit.index(i),
                                                       dtype=ns_dtypes[i])
            if mine:  # on CPU in the workspace; a result that waits for the broadcast leaves it in its wire dtype
                ws = self._workspace if params[unit[0]].device.type == "cpu" else None
                self._orthogonalize_unit(unit, hidden, dirs, shapes, ns_dtypes[unit[0]], results, ws)
                for i in unit if owners is not None else ():
                    q = results[i]
                    out = torch.empty_like(q, dtype=wire[i]) if ws is None else ws(f"res{i}", q.shape, wire[i])
                    results[i] = out.copy_(q)  # type: ignore[arg-type]
            for i in unit:
                dirs[i] = None
                if owners is None:  # nothing to wait for: apply now and let the update go
                    self._apply(*hidden[i], results[i], rank, world)  # type: ignore[arg-type]
                    results[i] = None
        if owners is not None:
            device = params[0].grad.device
            ws = self._workspace if device.type == "cpu" else None
            broadcast_results(units, owners, results, shapes, wire, device, group_pg, rank, world, ws)
            for (p, g), q in zip(hidden, results, strict=True):
                self._apply(p, g, q, rank, world)  # type: ignore[arg-type]

    @staticmethod
    def _orthogonalize_unit(unit: list[int], hidden: list, dirs: list, shapes: list, dtype: torch.dtype,
                            results: list, ws: Workspace | None = None) -> None:
        """(signed) NS5 of one unit's directions (one batched call for several), into `results`."""
        g = hidden[unit[0]][1]
        mats = [dirs[i].reshape(shapes[i]) for i in unit]
        x = mats[0] if len(unit) == 1 else torch.stack(mats)
        scratch = len(unit) > 1 or g["nesterov"]  # a stacked copy or c made for NS alone (not the momentum m)
        q = orthogonalize(x, steps=g["ns_steps"], dtype=dtype, form=g["ns_form"], scratch=scratch, ws=ws)
        q = q.sign_() if g["sign"] else q  # exact in any dtype; in place on NS's own output
        for j, i in enumerate(unit):
            results[i] = q if len(unit) == 1 else q[j]

    def _momentum_direction(self, p: Tensor, group: dict[str, Any], need: bool = True, slot: int = 0,
                            dtype: torch.dtype | None = None) -> Tensor | None:
        """Update the EMA m and return c, the Nesterov mix of g and m (this rank's shard for a DTensor); with
        `need=False` (another rank orthogonalises this matrix) only update m. On CPU c is written in the NS
        `dtype` into a buffer kept per (shape, dtype, `slot` in its NS unit) and reused by every later matrix of
        that shape: no fresh memory to fault in per matrix and step (measured: ~10% of the step on CPU)."""
        g, state = p.grad, self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        m = state["momentum_buffer"]
        b1, b2 = group["betas"]
        ws = cast = None
        if need and group["nesterov"] and dtype is not None and g.device.type == "cpu" and not is_dtensor(g):
            cast = self._workspace(f"cast{slot}", g.shape, dtype)
            ws = cast if dtype == g.dtype else self._workspace(f"dir{slot}", g.shape, g.dtype)  # no same-dtype copy
        c = torch.lerp(g, m, b1, out=ws) if need and group["nesterov"] and group["pre_update_momentum"] else None
        m.lerp_(g, 1 - b2)
        if not need:
            return None
        if c is None:
            c = torch.lerp(g, m, b1, out=ws) if group["nesterov"] else m
        if cast is not None and cast is not c:  # one op per dtype: a mixed-dtype lerp allocates a temporary
            c = cast.copy_(c)
        return c.to_local() if is_dtensor(c) else c

    @staticmethod
    def _apply(p: Tensor, group: dict[str, Any], q: Tensor, rank: int, world: int) -> None:
        """W ← W(1−ηλ) − η·scale·q, q the (signed) NS5 output of the full matrix; a DTensor keeps its shard. For a
        stack of experts q is (E, out, in) and each expert gets its own scale (shape (E, 1, 1))."""
        # scaling happens in ≥fp32 so entries are 0.2·lr to fp32 precision
        dtype = torch.promote_types(p.dtype, torch.float32)
        fused = group["sign"] and group["use_scale"] and not is_dtensor(p)  # q: NS's dtype, or int8 off the wire
        scale = update_scale(q, group, exact_sign=fused and dtype == torch.float32, dtype=dtype)
        local = p.to_local() if is_dtensor(p) else p
        local.mul_(1 - group["lr"] * group["weight_decay"])
        if fused and isinstance(scale, Tensor) and scale.ndim == 3:  # per-expert scales: a tensor operand
            scale = scale.to(local.dtype)
        if fused:  # q·scale is exact for q in {−1, 0, 1}: one pass, the unfused update up to rounding lr·scale (tested)
            local.addcmul_(q.reshape(p.shape), scale, value=-group["lr"])
            return
        local.add_(shard_of((q.to(dtype) * scale).reshape(p.shape), p, rank, world), alpha=-group["lr"])
