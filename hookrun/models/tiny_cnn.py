"""The small CNN shipped with hookrun, trained on generated shapes (model=tiny_cnn), read offline.

    model = tiny_cnn()               # TinyCNN: (n, 1, 32, 32) images -> 4 logits (circle, square, triangle, cross)
    model(torch.zeros(1, 1, 32, 32)).shape   # torch.Size([1, 4])

Its weights live in the package (hookrun/models/tiny_cnn/: model.safetensors and training.json,
the record of the run that made them); examples/train_tiny_cnn.py retrains them from
hookrun.data.shapes. Three conv blocks (block1..block3: conv, relu; a 2x2 max-pool after the first
two), a global average pool and `fc`: block3's 8 x 8 maps are what Grad-CAM reads.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from hookrun.errors import ConfigError

FOLDER = Path(__file__).with_name("tiny_cnn")
WIDTHS = (16, 32, 32)


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 4, widths: tuple[int, ...] = WIDTHS) -> None:
        super().__init__()
        a, b, c = widths
        self.block1 = nn.Sequential(nn.Conv2d(1, a, 3, padding=1), nn.ReLU())
        self.pool1 = nn.MaxPool2d(2)
        self.block2 = nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.ReLU())
        self.pool2 = nn.MaxPool2d(2)
        self.block3 = nn.Sequential(nn.Conv2d(b, c, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block3(self.pool2(self.block2(self.pool1(self.block1(x)))))
        return self.fc(x.mean(dim=(2, 3)))


def tiny_cnn() -> nn.Module:
    """The shipped model, in float32, from the package folder; nothing is downloaded."""
    path = FOLDER / "model.safetensors"
    if not path.is_file():
        raise ConfigError(f"model=tiny_cnn: no weights at {str(path)!r}; reinstall hookrun, or write them with "
                          f"python examples/train_tiny_cnn.py")
    from safetensors.torch import load_file

    model = TinyCNN()
    model.load_state_dict(load_file(str(path)))
    return model.eval()
