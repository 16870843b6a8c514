"""The mask sweep measures what it claims: a mask-blind oracle scores 1.0 with TV 0, a distracted model drops."""

import torch
from torch import nn

from framework.callbacks.mask_sweep import format_table, mask_sweep
from framework.data.needle import NDL, NeedleData


class Oracle(nn.Module):
    """Reads the value after the needle marker; `distract=True` answers wrongly once the input is long."""

    def __init__(self, vocab: int, distract: bool = False):
        super().__init__()
        self.vocab, self.distract = vocab, distract
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        logits = torch.zeros(*x.shape, self.vocab)
        pos = (x == NDL).float().argmax(1)
        value = x.gather(1, (pos + 1)[:, None]).squeeze(1)
        if self.distract and x.shape[1] > 40:
            value = torch.full_like(value, 6)  # always the first content symbol
        logits[torch.arange(x.shape[0]), :, :] = -5.0
        logits[torch.arange(x.shape[0])[:, None], torch.arange(x.shape[1])[None], value[:, None]] = 5.0
        return logits


def test_mask_blind_oracle_scores_perfectly_with_zero_tv():
    data = NeedleData()
    table = mask_sweep(Oracle(data.vocab_size), data, [0, 2, 16, 64], n_per_slot=10)
    assert table["acc"] == [1.0, 1.0, 1.0, 1.0]
    assert max(table["tv"]) < 1e-6
    assert "accuracy" in format_table(table)


def test_distracted_model_loses_accuracy_and_gains_tv_beyond_its_length():
    data = NeedleData()
    table = mask_sweep(Oracle(data.vocab_size, distract=True), data, [2, 16, 32, 64], n_per_slot=25)
    acc = dict(zip(table["m"], table["acc"], strict=True))
    tv = dict(zip(table["m"], table["tv"], strict=True))
    assert acc[2] == acc[16] == 1.0  # inputs of 19+1+m <= 40 tokens
    assert acc[32] < 0.2 and tv[32] > 0.5
