"""Small image classifiers with timm's feature API: `forward_features` → `forward_head(pre_logits=True)` gives
the penultimate feature (the Data Agent's state), `get_classifier()` the last layer. A timm model plugs into
the same `Classifier` module."""

from __future__ import annotations

import math

from torch import Tensor, nn

from framework.models.base import RecordsConfig


def _shape(input_shape: list[int] | tuple[int, ...] | None, num_classes: int | None) -> tuple[int, ...]:
    if not input_shape or num_classes is None or num_classes < 2:
        raise ValueError(f"need input_shape (got {input_shape}) and num_classes >= 2 (got {num_classes}); "
                         "the data module reports both")
    return tuple(int(s) for s in input_shape)


class MLP(RecordsConfig):
    """Flatten → `depth` × (Linear, ReLU) of width `hidden` → Linear head (data_agent_digits' 64→256→256→10 MLP).

    Args:
        input_shape: shape of one input example, e.g. (1, 8, 8); supplied from the data at build time.
        num_classes: number of output classes (≥ 2); supplied from the data at build time.
        hidden: width of every hidden layer, also the penultimate feature size.
        depth: number of hidden (Linear, ReLU) layers, ≥ 1.
    """

    def __init__(self, input_shape: list[int] | None = None, num_classes: int | None = None, hidden: int = 256,
                 depth: int = 2):
        super().__init__()
        shape = _shape(input_shape, num_classes)
        if depth < 1 or hidden < 1:
            raise ValueError(f"depth={depth} and hidden={hidden} must be >= 1")
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(shape)
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, num_classes)
        self.num_features = hidden

    def forward_features(self, x: Tensor) -> Tensor:
        return self.body(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        return x if pre_logits else self.head(x)

    def get_classifier(self) -> nn.Module:
        return self.head

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


class ConvNet(RecordsConfig):
    """Two 3×3 conv blocks (BatchNorm, ReLU, 2×2 max-pool after the second) → global average pool → Linear to
    `hidden` (ReLU) → head; for small images such as 8×8 digits.

    Args:
        input_shape: (channels, height, width) of one image; supplied from the data at build time.
        num_classes: number of output classes (≥ 2); supplied from the data at build time.
        channels: output channels of the first conv block; the later blocks use twice as many.
        hidden: width of the Linear layer before the head, also the penultimate feature size.
    """

    def __init__(self, input_shape: list[int] | None = None, num_classes: int | None = None, channels: int = 32,
                 hidden: int = 128):
        super().__init__()
        shape = _shape(input_shape, num_classes)
        if len(shape) != 3:
            raise ValueError(f"ConvNet needs image inputs (channels, height, width), got input_shape={list(shape)}")
        c = shape[0]

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.features = nn.Sequential(*block(c, channels), *block(channels, 2 * channels), nn.MaxPool2d(2),
                                      *block(2 * channels, 2 * channels))
        self.pre_logits = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, hidden),
                                        nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)
        self.num_features = hidden

    def forward_features(self, x: Tensor) -> Tensor:
        return self.features(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = self.pre_logits(x)
        return x if pre_logits else self.head(x)

    def get_classifier(self) -> nn.Module:
        return self.head

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))
