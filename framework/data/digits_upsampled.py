"""A harder image workload from data that ships offline: scikit-learn's digits upsampled to `size`×`size` for a
small CNN (e.g. timm's `test_resnet`), with symmetric label noise on the training split (20% by default).

Same splits, normalisation and `noisy` mask as `DigitsData`; only the images are resized (bilinear), so a
convolutional backbone has room for its strides and the selection policies see a CNN's penultimate features.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from framework.data.digits import DigitsData


class UpsampledDigits(DigitsData):
    """Digits as (1, size, size) images (bilinear upsampling of the 8×8 originals), `label_noise` on training.

    The settings it shares with `DigitsData` mean the same and are documented there.

    Args:
        size: image side in pixels after upsampling, an integer ≥ 8.
    """

    def __init__(self, size: int = 16, batch_size: int = 64, seed: int = 0, label_noise: float = 0.2,
                 pixel_noise: float = 0.0, val_fraction: float = 0.1, test_fraction: float = 0.2,
                 num_workers: int = 0):
        if not isinstance(size, int) or size < 8:
            raise ValueError(f"size={size!r} must be an integer >= 8 (the digits are 8×8)")
        super().__init__(batch_size, seed, label_noise, pixel_noise, val_fraction, test_fraction, num_workers)
        self.size = size
        self.input_shape = [1, size, size]

    def arrays(self) -> tuple[Tensor, Tensor]:
        x, y = super().arrays()
        if self.size != x.shape[-1]:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return x, y
