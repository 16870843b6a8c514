"""Verifiable rewards for probes: functions (generated, answer) → one float per row, both (rows, tokens).

Any callable with this signature plugs into `RLKVProbe(reward=...)` (and into the exact-match evaluation of every
probe); answers are right-padded after EOS, and decoders pad generations the same way.
"""

from __future__ import annotations

from torch import Tensor


def exact_match(generated: Tensor, answer: Tensor) -> Tensor:
    """1.0 where the whole generated answer (EOS and the padding after it included) equals the reference, else 0."""
    width = min(generated.shape[1], answer.shape[1])
    return (generated[:, :width] == answer[:, :width]).all(dim=1).float()


def token_accuracy(generated: Tensor, answer: Tensor) -> Tensor:
    """Fraction of reference tokens reproduced at their position (a denser, partial-credit reward)."""
    width = min(generated.shape[1], answer.shape[1])
    return (generated[:, :width] == answer[:, :width]).float().mean(dim=1)
