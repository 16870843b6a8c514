"""Random draws on their generator's device, by construction.

torch refuses a draw whose generator lives on another device ("Expected a 'cpu' device type for generator"), and a
draw without `device=` lands on the default device, which a user may have set to a GPU. So every draw in framework/
that takes a generator names its device from the generator: `device=draw_device(generator, fallback)` for a
factory (`torch.rand`, `randn`, `randint`, `randperm`), an input moved by `to_generator` for an op that samples
from a tensor (`torch.multinomial`, `bernoulli`, `_standard_gamma`). tests/test_rng_devices.py reads the source
and fails on a draw that does neither.
"""

from __future__ import annotations

import torch
from torch import Tensor


def draw_device(generator: torch.Generator | None, device: torch.device | str | None = None
                ) -> torch.device | str | None:
    """The device a draw with `generator` runs on: the generator's own; `device` when there is no generator."""
    return generator.device if generator is not None else device


def to_generator(t: Tensor, generator: torch.Generator | None) -> Tensor:
    """`t` on the generator's device (unchanged without a generator), for ops that sample from a tensor."""
    return t if generator is None else t.to(generator.device)
