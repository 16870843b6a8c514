"""Quintic Newton–Schulz orthogonalisation (Keller Jordan's NS5), shared by OLion and its NS-only ablation.

Spec: shared/specs/olion_growth.md §1.3. The iteration maps G = U Σ Vᵀ to roughly U Σ' Vᵀ with Σ' in a band
around 1 (≈[0.68, 1.2] after 5 steps for σ/‖G‖_F ≥ 1.5e-3); it does not converge to exactly U Vᵀ.
"""

from __future__ import annotations

import torch
from torch import Tensor

NS_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)


def newton_schulz5(
    G: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = torch.bfloat16
) -> Tensor:
    """Approximate the orthogonal polar factor of G (shape (..., m, n)) with `steps` quintic NS iterations.

    G is cast to `dtype` (None keeps G's dtype), divided by its Frobenius norm + eps (so the spectral norm
    is ≤ 1) and iterated on the wide orientation. Leading dims are a batch. The result stays in the compute
    dtype: callers cast it themselves (OLion takes the sign first, which is exact in any dtype).
    """
    if G.ndim < 2:
        raise ValueError(f"newton_schulz5 needs a matrix (ndim >= 2), got shape {tuple(G.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    a, b, c = NS_COEFFICIENTS
    shape = G.shape
    X = G.to(dtype) if dtype is not None else G
    own = X.data_ptr() != G.data_ptr()  # the cast made a copy
    if X.ndim > 3:
        X = X.reshape(-1, *shape[-2:])
    tall = shape[-2] > shape[-1]
    if tall:
        X = X.mT
    norm = X.norm(dim=(-2, -1), keepdim=True) + eps
    X = X.div_(norm) if own else X / norm  # in place only on our own cast copy, never on the caller's G
    # addmm/baddbmm fuse a·X + B·X the same way torch.optim.Muon does, so the two agree bit for bit in bf16
    mm = torch.addmm if X.ndim == 2 else torch.baddbmm
    for _ in range(steps):
        A = X @ X.mT
        B = mm(A, A, A, beta=b, alpha=c)
        X = mm(X, B, X, beta=a)
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


def uses_gram(shape: tuple[int, ...] | torch.Size, form: str) -> bool:
    """Whether `form` ("auto", "standard", "gram") runs the Gram form on a matrix of this (…, m, n) shape."""
    if form not in NS_FORMS:
        raise ValueError(f"ns_form={form!r} is invalid: valid: {', '.join(NS_FORMS)}")
    m, n = sorted(shape[-2:])
    return form == "gram" or (form == "auto" and n >= GRAM_MIN_ASPECT * m)


def _gram_poly(A: Tensor) -> Tensor:
    """Q = a·I + b·A + c·A², the quintic NS step X ← Q·X written on A = X·Xᵀ."""
    a, b, c = NS_COEFFICIENTS
    Q = (torch.addmm if A.ndim == 2 else torch.baddbmm)(A, A, A, beta=b, alpha=c)
    Q.diagonal(dim1=-2, dim2=-1).add_(a)
    return Q


def gram_newton_schulz5(
    G: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = torch.bfloat16,
    restart: int | None = None,
) -> Tensor:
    """NS5 of G (shape (..., m, n)) iterated on the short side's Gram matrix A = X·Xᵀ (m×m, m the short side).

    Each step X ← Q(A)·X (Q = a + b·A + c·A²) is a polynomial in A, so the iterates are P·X₀ with P the product
    of the Q's, and A ← Q·A·Q: the long side n is touched twice (A₀ and P·X₀) instead of twice per step. Same
    map as `newton_schulz5` in exact arithmetic. The norm is taken in ≥fp32. `restart` (None: one before
    iteration `GRAM_RESTART_16BIT` in 16-bit dtypes, never in fp32/fp64) rebuilds X = P·X₀ and A from it.
    """
    if G.ndim < 2:
        raise ValueError(f"gram_newton_schulz5 needs a matrix (ndim >= 2), got shape {tuple(G.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    dtype = dtype or G.dtype
    if restart is None and dtype.itemsize <= 2 and steps > GRAM_RESTART_16BIT:
        restart = GRAM_RESTART_16BIT
    shape = G.shape
    X = G.reshape(-1, *shape[-2:]) if G.ndim > 3 else G
    tall = shape[-2] > shape[-1]
    X = X.mT if tall else X
    X = X.to(torch.promote_types(X.dtype, torch.float32))
    X = (X / (X.norm(dim=(-2, -1), keepdim=True) + eps)).to(dtype)
    A, P = X @ X.mT, None
    for k in range(steps):
        if k == restart and P is not None:
            X, P = P @ X, None
            A = X @ X.mT
        Q = _gram_poly(A)
        if k + 1 < steps and k + 1 != restart:  # the next A is needed
            A = Q @ (A @ Q)
        P = Q if P is None else Q @ P
    X = P @ X
    X = X.mT if tall else X
    return X.reshape(shape)


def orthogonalize(
    G: Tensor, steps: int = 5, dtype: torch.dtype | None = torch.bfloat16, form: str = "auto"
) -> Tensor:
    """NS5 of G in the standard or the Gram form, as `form` and G's shape decide (`uses_gram`)."""
    if uses_gram(G.shape, form):
        return gram_newton_schulz5(G, steps=steps, dtype=dtype)
    return newton_schulz5(G, steps=steps, dtype=dtype)
