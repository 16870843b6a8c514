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
    if X.ndim > 3:
        X = X.reshape(-1, *shape[-2:])
    tall = shape[-2] > shape[-1]
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    # addmm/baddbmm fuse a·X + B·X the same way torch.optim.Muon does, so the two agree bit for bit in bf16
    mm = torch.addmm if X.ndim == 2 else torch.baddbmm
    for _ in range(steps):
        A = X @ X.mT
        B = mm(A, A, A, beta=b, alpha=c)
        X = mm(X, B, X, beta=a)
    if tall:
        X = X.mT
    return X.reshape(shape)
