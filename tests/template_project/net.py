"""The template's `SimpleDenseNet`: a small MLP (here for 8×8 digits, 64 inputs)."""

from torch import Tensor, nn


class SimpleDenseNet(nn.Module):
    def __init__(self, input_size: int = 64, lin1_size: int = 32, lin2_size: int = 32, output_size: int = 10):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(input_size, lin1_size), nn.BatchNorm1d(lin1_size), nn.ReLU(),
            nn.Linear(lin1_size, lin2_size), nn.BatchNorm1d(lin2_size), nn.ReLU(),
            nn.Linear(lin2_size, output_size),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x.flatten(1))
