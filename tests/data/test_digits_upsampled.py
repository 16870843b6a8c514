"""The harder selection workload: digits upsampled for a small CNN, with label noise on the training split only."""

import pytest
import torch

from framework.data.digits import DigitsData
from framework.data.digits_upsampled import UpsampledDigits


def test_upsampled_digits_keep_the_splits_and_corrupt_exactly_the_noise_fraction_of_training_labels():
    big, small = UpsampledDigits(size=16, label_noise=0.4, seed=3), DigitsData(label_noise=0.4, seed=3)
    big.setup()
    small.setup()
    assert big.train_set.x.shape[1:] == (1, 16, 16) and big.input_shape == [1, 16, 16]
    assert torch.equal(big.train_set.y, small.train_set.y) and torch.equal(big.noisy, small.noisy)
    assert big.noisy.sum() == int(0.4 * len(big.train_set))
    assert torch.equal(big.test_set.y, small.test_set.y)  # same split, clean test labels
    # bilinear upsampling then the same standardisation: 2×2 average pooling gives back the 8×8 image closely
    pooled = torch.nn.functional.avg_pool2d(big.test_set.x, 2)
    assert torch.corrcoef(torch.stack([pooled.flatten(), small.test_set.x.flatten()]))[0, 1] > 0.95


def test_a_size_below_the_originals_is_refused():
    with pytest.raises(ValueError, match="size=4 must be an integer >= 8"):
        UpsampledDigits(size=4)
