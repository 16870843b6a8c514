"""Quintic Newton–Schulz orthogonalisation (Keller Jordan's NS5), shared by OLion and its NS-only ablation.

The iteration maps G = U Σ Vᵀ to roughly U Σ' Vᵀ with Σ' in a band around 1 (≈[0.68, 1.2] after 5 steps for σ/‖G‖_F
≥ 1.5e-3); it does not converge to exactly U Vᵀ.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

NS_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)


class Workspace:
    """Buffers kept by (tag, shape, dtype) and handed out again on every later call: with one, an NS call writes
    every product into a buffer it had before instead of fresh memory (on CPU fresh memory is faulted in page by
    page: measured up to ~10% of OLion's step). A buffer's contents last until the next call that uses its tag."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, Tensor] = {}

    def __call__(self, tag: str, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor:
        key = (tag, tuple(shape), dtype)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(shape, dtype=dtype)
        return self._buffers[key]

    def __len__(self) -> int:
        return len(self._buffers)


def _out(ws: Workspace | None, tag: str, like: Tensor, rows: int, cols: int) -> Tensor | None:
    """`ws`'s buffer for a (…, rows, cols) product of `like`'s batch dims and dtype (None without a workspace)."""
    return None if ws is None else ws(tag, (*like.shape[:-2], rows, cols), like.dtype)


def _check_input(G: Tensor, steps: int, name: str) -> None:
    if G.ndim < 2:
        raise ValueError(f"{name} needs a matrix (ndim >= 2), got shape {tuple(G.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")


def newton_schulz5(
    G: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = torch.bfloat16, scratch: bool = False,
    ws: Workspace | None = None,
) -> Tensor:
    """Approximate the orthogonal polar factor of G (shape (..., m, n)) with `steps` quintic NS iterations.

    G is cast to `dtype` (None keeps G's dtype), divided by its Frobenius norm + eps (so the spectral norm
    is ≤ 1) and iterated on the wide orientation. Leading dims are a batch. The result stays in the compute
    dtype: callers cast it themselves (OLion takes the sign first, which is exact in any dtype). `scratch=True`
    lets it divide G in place when G is already in `dtype` (the caller's own buffer). With `ws` every product
    goes into a workspace buffer, the result too: use it before the next call with the same workspace.
    """
    _check_input(G, steps, "newton_schulz5")
    a, b, c = NS_COEFFICIENTS
    shape = G.shape
    X = G.to(dtype) if dtype is not None else G
    own = scratch or X.data_ptr() != G.data_ptr()  # the cast made a copy, or G is the caller's scratch
    if X.ndim > 3:
        X = X.reshape(-1, *shape[-2:])
    tall = shape[-2] > shape[-1]
    if tall:
        X = X.mT
    norm = X.norm(dim=(-2, -1), keepdim=True) + eps
    X = X.div_(norm) if own else X / norm  # in place only on our own cast copy, never on the caller's G
    # addmm/baddbmm fuse a·X + B·X the same way torch.optim.Muon does: from the same normalised X the two agree
    # bit for bit in bf16 (the norm is taken our own way, over two dims + eps: it may round differently)
    mm = torch.addmm if X.ndim == 2 else torch.baddbmm
    s, n = X.shape[-2:]
    for k in range(steps):
        A = torch.matmul(X, X.mT, out=_out(ws, "A", X, s, s))
        B = mm(A, A, A, beta=b, alpha=c, out=_out(ws, "B", X, s, s))
        X = mm(X, B, X, beta=a, out=_out(ws, f"X{k % 2}", X, s, n))  # two buffers: an output never aliases X
    if tall:
        X = X.mT
    return X.reshape(shape)


#: `ns_form` values: "auto" (the Gram form where it saves work, see `uses_gram`), "standard", "gram".
NS_FORMS = ("auto", "standard", "gram")
#: "auto" iterates on the Gram matrix when the long side is at least this many times the short side: by FLOPs
#: the Gram form costs (17 + 2r)/(10r + 5) of the standard form at aspect ratio r, ~0.88 at r = 2 and ~0.56 at r = 4
GRAM_MIN_ASPECT = 2.0
#: in a 16-bit dtype the Gram form rebuilds X and its Gram matrix once, before this iteration (0-based); without
#: it bf16 rounding of the Gram matrix swamps the small singular values (sign agreement with float64 NS5 fell to
#: 0.70 on low-rank + noise matrices; with the restart before iteration 3: 0.987, standard bf16 NS5: 0.98)
GRAM_RESTART_16BIT = 3


def check_ns_form(form: object) -> None:
    """ValueError naming the valid `ns_form` values unless `form` is one."""
    if form not in NS_FORMS:
        raise ValueError(f"ns_form={form!r} is invalid: valid: {', '.join(NS_FORMS)}")


def uses_gram(shape: tuple[int, ...] | torch.Size, form: str) -> bool:
    """Whether `form` ("auto", "standard", "gram") runs the Gram form on a matrix of this (…, m, n) shape."""
    check_ns_form(form)
    m, n = sorted(shape[-2:])
    return form == "gram" or (form == "auto" and n >= GRAM_MIN_ASPECT * m)


def _gram_poly(A: Tensor, out: Tensor | None = None) -> Tensor:
    """Q = a·I + b·A + c·A², the quintic NS step X ← Q·X written on A = X·Xᵀ."""
    a, b, c = NS_COEFFICIENTS
    Q = (torch.addmm if A.ndim == 2 else torch.baddbmm)(A, A, A, beta=b, alpha=c, out=out)
    Q.diagonal(dim1=-2, dim2=-1).add_(a)
    return Q


def gram_newton_schulz5(
    G: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = torch.bfloat16,
    restart: int | None = None, scratch: bool = False, ws: Workspace | None = None,
) -> Tensor:
    """NS5 of G (shape (..., m, n)) iterated on the short side's Gram matrix A = X·Xᵀ (m×m, m the short side).

    Each step X ← Q(A)·X (Q = a + b·A + c·A²) is a polynomial in A, so the iterates are P·X₀ with P the product
    of the Q's, and A ← Q·A·Q: the long side n is touched twice (A₀ and P·X₀) instead of twice per step. Same
    map as `newton_schulz5` in exact arithmetic. The norm is taken on G as given. `restart` (None: one before
    iteration `GRAM_RESTART_16BIT` in 16-bit dtypes, never in fp32/fp64) rebuilds X = P·X₀ and A from it.
    `scratch=True`: G may be divided in place when it is already in `dtype`; `ws`: as in `newton_schulz5`.
    """
    _check_input(G, steps, "gram_newton_schulz5")
    dtype = dtype or G.dtype
    if restart is None and dtype.itemsize <= 2 and steps > GRAM_RESTART_16BIT:
        restart = GRAM_RESTART_16BIT
    shape = G.shape
    X = G.reshape(-1, *shape[-2:]) if G.ndim > 3 else G
    # the norm from X as given (≥fp32 there), then X cast and divided in place: no ≥fp32 copy of X, and no op
    # mixing dtypes on the long matrix (torch casts its operands through copies for those)
    norm = (X.norm(dim=(-2, -1), keepdim=True) + eps).to(dtype)
    own = scratch or X.dtype != dtype  # the cast copies (or G is scratch), so X can be divided in place
    X = X.to(dtype)
    X = X.div_(norm) if own else X / norm
    # the long matrix is never transposed (elementwise passes and products on a transposed view copy it): a tall
    # X is used as it lies, with A = XᵀX and X·Pᵀ in place of P·X (the same numbers as on the wide orientation)
    tall = shape[-2] > shape[-1]
    r, n = X.shape[-2:]
    s = min(r, n)

    def gram(Y: Tensor) -> Tensor:
        return torch.matmul(*((Y.mT, Y) if tall else (Y, Y.mT)), out=_out(ws, "A", Y, s, s))

    def times(P: Tensor, Y: Tensor, tag: str) -> Tensor:
        return torch.matmul(*((Y, P.mT) if tall else (P, Y)), out=_out(ws, tag, Y, r, n))

    A, P, products = gram(X), None, 0
    for k in range(steps):
        if k == restart and P is not None:
            X, P = times(P, X, "X1"), None
            A = gram(X)
        Q = _gram_poly(A, _out(ws, f"Q{k % 2}", A, s, s))  # two Q buffers: P may still be the previous Q
        if k + 1 < steps and k + 1 != restart:  # the next A is needed
            A = torch.matmul(Q, torch.matmul(A, Q, out=_out(ws, "T", A, s, s)), out=A if ws else None)
        if P is None:
            P = Q
        else:
            P, products = torch.matmul(Q, P, out=_out(ws, f"P{products % 2}", A, s, s)), products + 1
    return times(P, X, "out").reshape(shape)


def orthogonalize(
    G: Tensor, steps: int = 5, dtype: torch.dtype | None = torch.bfloat16, form: str = "auto",
    scratch: bool = False, ws: Workspace | None = None,
) -> Tensor:
    """NS5 of G in the standard or the Gram form, as `form` and G's shape decide (`uses_gram`); `scratch=True`:
    G is the caller's buffer and may be overwritten; `ws`: a `Workspace` for every product (the result too)."""
    if uses_gram(G.shape, form):
        return gram_newton_schulz5(G, steps=steps, dtype=dtype, scratch=scratch, ws=ws)
    return newton_schulz5(G, steps=steps, dtype=dtype, scratch=scratch, ws=ws)


def sign_norm(q: Tensor) -> Tensor:
    """‖q‖_F in fp32 for q with entries in {−1, 0, 1} (any dtype): √(count of nonzeros), correctly rounded, without
    the fp32 copy of q that `vector_norm(q, dtype=torch.float32)` makes (that call agrees within 1 ulp). |q| is summed
    over 256 rows in q's own dtype (every partial count is an integer ≤ 256, exact even in bf16), those column counts
    in fp32; an integer q (int8 off the DDP wire) is counted directly. Exact up to 2^24 entries."""
    if not q.is_floating_point():
        return _root(torch.count_nonzero(q))
    flat = q.reshape(-1) if q.is_contiguous() else q.mT.reshape(-1)  # a transposed view flattens without a copy
    n = flat.numel() // 256 * 256
    count = flat[:n].view(256, -1).abs().sum(0).sum(dtype=torch.float32)
    if n < flat.numel():
        count = count + flat[n:].abs().float().sum()  # < 256 entries
    return _root(count)


def _root(count: Tensor) -> Tensor:
    """The fp32 √ of an integer count < 2^24, correctly rounded on every CPU: torch's fp32 sqrt is not (1 ulp off for
    about 1 in 5 such integers on an AMD EPYC), while √n lies ≥ 4 fp64 ulps from every fp32 rounding midpoint, so
    the fp64 root rounds to the right fp32 value."""
    return count.to(torch.float64).sqrt().to(torch.float32)


def update_scale(q: Tensor, group: dict, exact_sign: bool, dtype: torch.dtype) -> Tensor | float:
    """OLion's factor on its (signed) NS5 output q: `use_scale` sets ‖q‖_F to √(min dim), `rms_scale` multiplies by
    0.2·√(max dim). A stack of MoE experts q (E, out, in) gets one factor per expert, shape (E, 1, 1). `exact_sign`:
    q is a sign in fp32 math, whose norm is √(nonzero count), correctly rounded (`sign_norm`)."""
    d_out, d_in = q.shape[-2:]
    scale: Tensor | float = 1.0
    if group["use_scale"]:
        if q.ndim == 3:  # per expert: √(nonzero count) for a sign, else each expert's Frobenius norm
            norm = (_root(torch.count_nonzero(q, dim=(1, 2))) if exact_sign
                    else torch.linalg.vector_norm(q.to(dtype), dim=(1, 2))).view(-1, 1, 1)
        else:
            norm = sign_norm(q) if exact_sign else torch.linalg.vector_norm(q.to(dtype))
        scale = math.sqrt(min(d_out, d_in)) / (norm + group["eps"])
    if group["rms_scale"]:
        scale = scale * (0.2 * math.sqrt(max(d_out, d_in)))
    return scale
