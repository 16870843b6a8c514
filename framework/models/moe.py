"""A mixture-of-experts transformer LM: the dense `TransformerLM` with its feed-forward layer replaced by `MoE`.

`MoE` routes every token to `top_k` of `num_experts` SwiGLU experts (plus an optional always-on shared expert)
under an explicit router convention. Its Switch-style load-balancing loss is an ordinary loss term: each
training forward leaves `aux_loss_coef · balance` pending, and the training step adds
`model.pop_aux_loss()` to the loss it returns, so gradient accumulation, loss multipliers and AMP scaling
reach it exactly as they reach the main loss (framework modules do this; see `TrainModule.pop_model_aux_loss`).
Experts are separate modules (one 2-D matrix per tensor), so OLion/Muon orthogonalise each expert on its own and
width growth (framework.grow, docs/growth.md) can append copies.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from framework.models.base import RecordsConfig
from framework.models.transformer import LanguageModel, check_positive

#: Router conventions. All but `sigmoid_topk` give each token gate weights that sum to a quantity unchanged by
#: duplicating every expert and doubling top_k (so noise-free width growth preserves the function).
ROUTERS = ("softmax_topk", "softmax_topk_renorm", "topk_softmax", "sigmoid_topk_norm", "sigmoid_topk")


def route(logits: Tensor, top_k: int, router: str) -> tuple[Tensor, Tensor, Tensor]:
    """Gate weights (N, k), expert ids (N, k) and per-expert routing probabilities (N, E) for the aux loss.

    softmax_topk: p = softmax(z), keep the k largest p (Qwen/DeepSeek-V2); `_renorm` rescales them to sum 1;
    topk_softmax: softmax over the k largest logits (Mixtral, Megatron default); sigmoid_topk_norm: s = σ(z),
    k largest, divided by their sum (DeepSeek-V3); sigmoid_topk: the same without the division.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):  # route in fp32; fp32/fp64 stay as they are
        logits = logits.float()
    if router.startswith("softmax") or router == "topk_softmax":
        probs = logits.softmax(-1)
        if router == "topk_softmax":
            top, idx = logits.topk(top_k, dim=-1)
            return top.softmax(-1), idx, probs
        weights, idx = probs.topk(top_k, dim=-1)
        if router == "softmax_topk_renorm":
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, idx, probs
    if router.startswith("sigmoid"):
        scores = logits.sigmoid()
        weights, idx = scores.topk(top_k, dim=-1)
        if router == "sigmoid_topk_norm":
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, idx, scores / scores.sum(-1, keepdim=True)
    raise ValueError(f"router={router!r} is not a router convention; valid: {', '.join(ROUTERS)}")


def load_balancing_loss(probs: Tensor, idx: Tensor, num_experts: int) -> Tensor:
    """Switch-Transformer balance loss E·Σ_i f_i·P_i (f_i: share of the N·k assignments, P_i: mean probability).

    Duplicating every expert and doubling k halves both f_i and P_i over twice the experts: the value is unchanged.
    """
    counts = torch.zeros(num_experts, device=idx.device, dtype=probs.dtype)
    counts.scatter_add_(0, idx.flatten(), torch.ones(idx.numel(), device=idx.device, dtype=probs.dtype))
    return num_experts * (counts / idx.numel() * probs.mean(0)).sum()


#: Training forwards whose balance term may wait uncollected; beyond this nobody calls `pop_aux_loss()`, so the
#: terms are dropped with a warning instead of keeping every step's graph alive.
MAX_PENDING = 16


class Expert(nn.Module):
    """A SwiGLU feed-forward expert: proj(silu(gate) * up), gate and up fused in `fc`."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(dim, 2 * hidden, bias=False)
        self.proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)


class MoE(nn.Module):
    """Top-k routed experts (+ an optional shared expert). Growth protocol: `router` (Linear dim→E), `experts`
    (ModuleList), `num_experts`, `top_k`; `last_aux_loss` holds the latest balance loss (before the coefficient,
    detached, for logging). In training mode with grad enabled, each forward also queues `aux_loss_coef · balance`
    (differentiable) for `pop_aux_loss()`, which the training step adds to its loss."""

    def __init__(self, dim: int, num_experts: int, top_k: int, hidden: int, router: str = "softmax_topk_renorm",
                 shared_hidden: int = 0, aux_loss_coef: float = 0.01):
        super().__init__()
        if router not in ROUTERS:
            raise ValueError(f"router={router!r} is not a router convention; valid: {', '.join(ROUTERS)}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and num_experts={num_experts}")
        self.num_experts, self.top_k, self.router_type, self.aux_loss_coef = num_experts, top_k, router, aux_loss_coef
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(num_experts))
        self.shared = Expert(dim, shared_hidden) if shared_hidden else None
        self.last_aux_loss: Tensor | None = None
        self._pending: list[Tensor] = []  # coef · balance of the training forwards since the last pop

    def pop_aux_loss(self) -> Tensor | None:
        """The sum of `aux_loss_coef · balance` over the training forwards since the last call (None if none)."""
        terms, self._pending = self._pending, []
        return torch.stack(terms).sum() if terms else None

    def __getstate__(self) -> dict:
        # a queued term is part of a live autograd graph, which deepcopy/pickle cannot copy; a copy starts empty
        return {**super().__getstate__(), "_pending": []}

    def forward(self, x: Tensor) -> Tensor:
        flat = rearrange(x, "b t d -> (b t) d")
        weights, idx, probs = route(self.router(flat), self.top_k, self.router_type)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):  # an expert with no tokens still joins the graph (zero grads),
            token, slot = (idx == e).nonzero(as_tuple=True)  # so DDP never sees an unused parameter
            out.index_add_(0, token, expert(flat[token]) * weights[token, slot, None].to(flat.dtype))
        if self.shared is not None:
            out = out + self.shared(flat)
        aux = load_balancing_loss(probs, idx, self.num_experts)
        self.last_aux_loss = aux.detach()
        if self.training and self.aux_loss_coef and torch.is_grad_enabled():
            if len(self._pending) >= MAX_PENDING:
                warnings.warn(f"{MAX_PENDING} MoE balance-loss terms were never collected, so the router gets no"
                              " balance gradient: add `model.pop_aux_loss()` to the training loss (framework"
                              " modules do), or set aux_loss_coef=0", stacklevel=2)
                self._pending.clear()
            self._pending.append(aux * self.aux_loss_coef)
        return rearrange(out, "(b t) d -> b t d", b=x.shape[0])


class MoETransformerLM(LanguageModel, RecordsConfig):
    """Token ids (batch, seq) → logits; the `TransformerLM` shell with every block's feed-forward an `MoE`
    (`blocks.{i}.moe`). Layers are `self.blocks`.

    The output never contains the load-balancing loss: a training step adds `pop_aux_loss()` (coef · balance summed
    over layers) to its loss.

    Args:
        vocab_size: number of token ids (embedding rows and logits); supplied from the data at build time.
        dim: model width (embedding and residual stream size).
        depth: number of transformer blocks.
        heads: query heads per attention layer; must divide `dim` (head size dim/heads).
        kv_heads: key/value heads (grouped-query attention), dividing `heads`; None: one per query head.
        num_experts: experts per MoE layer.
        top_k: experts each token is routed to, at most `num_experts`.
        expert_hidden: hidden width of each SwiGLU expert; None: 2·dim (an expert then has 6·dim² weights).
        router: gate convention, one of `ROUTERS`: softmax_topk[_renorm], topk_softmax or sigmoid_topk[_norm].
        shared_hidden: hidden width of an always-on shared expert; 0: no shared expert.
        aux_loss_coef: weight of the load-balancing loss added to the training loss; 0 turns it off.
        max_seq_len: longest sequence (prompt plus generated tokens) the rotary tables cover.
        causal: causal attention (a left-to-right LM); False attends both ways (the diffusion backbone).
        dropout: dropout probability on embeddings, attention and feed-forward outputs, in [0, 1).
        tie_embeddings: share one weight between the token embedding and the LM head.
        init: weight initialisation, "gpt2" (N(0, 0.02²)) or "torch" (PyTorch's width-scaled defaults); `init_weights`.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        kv_heads: int | None = None,
        num_experts: int = 4,
        top_k: int = 1,
        expert_hidden: int | None = None,
        router: str = "softmax_topk_renorm",
        shared_hidden: int = 0,
        aux_loss_coef: float = 0.01,
        max_seq_len: int = 1024,
        causal: bool = True,
        dropout: float = 0.0,
        tie_embeddings: bool = False,
        init: str = "gpt2",
    ):
        check_positive(num_experts=num_experts, top_k=top_k)
        hidden = expert_hidden or 2 * dim
        super().__init__(vocab_size, dim, depth, heads, kv_heads, max_seq_len, causal, dropout, tie_embeddings,
                         feed_forward=lambda: MoE(dim, num_experts, top_k, hidden, router, shared_hidden,
                                                  aux_loss_coef),
                         ffn_name="moe", init=init)

    def moe_layers(self) -> list[MoE]:
        """The MoE feed-forward layers, first to last."""
        return [block.moe for block in self.blocks]

    def pop_aux_loss(self) -> Tensor | None:
        """Σ over layers of `aux_loss_coef · balance` from the training forwards since the last call, to be added
        to the training loss (differentiable); None when there is none (eval mode, no grad, or coef 0)."""
        terms = [t for t in (m.pop_aux_loss() for m in self.moe_layers()) if t is not None]
        return torch.stack(terms).sum() if terms else None

    def aux_loss(self) -> Tensor | None:
        """Mean load-balancing loss of the last forward pass over all layers (detached, for logging)."""
        losses = [m.last_aux_loss for m in self.moe_layers() if m.last_aux_loss is not None]
        return torch.stack(losses).mean() if losses else None
