"""An example of a user's own package, used by the README's custom-model commands and the tests.

    python -m hookrun model=custom model._target_=my_pkg.Net data=custom \
        data.dataset._target_=my_pkg.MyData +data.dataset.n=10

`python -m` puts the current folder on sys.path, so this imports from a checkout's root; your
own package only needs to be importable (installed, or on PYTHONPATH).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class Net(nn.Module):
    """A small CNN for 3x32x32 images: two conv blocks, global pooling, a linear head."""

    def __init__(self, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


class MyData(Dataset):
    """`n` random 3 x size x size images with labels in [0, 10), fixed per index."""

    def __init__(self, n: int = 100, seed: int = 0, size: int = 32) -> None:
        self.n, self.seed, self.size = n, seed, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.rand(3, self.size, self.size, generator=g), int(torch.randint(0, 10, (1,), generator=g))


def steer(x: torch.Tensor, ctx=None, strength: float = 0.5) -> torch.Tensor:
    """A steering op: push every channel towards its batch-mean direction by `strength`."""
    direction = x.mean(dim=0, keepdim=True)
    return x + strength * direction


from hookrun import Action, register_action  # noqa: E402


@register_action("log_norm")
class LogNorm(Action):
    """An action registered by name (list my_pkg under `imports:`): logs each output's norm."""

    def __call__(self, ev) -> None:
        for role, t in ev.tensors.items():
            if role.startswith("output"):
                print(f"{ev.hook} {ev.module} step {ev.step} {role} norm {t.norm().item():.4f}")


def print_shapes(ev) -> None:
    """A `_target_` action (with `_partial_: true`): any callable that takes the Event."""
    print(ev.hook, ev.module, {role: tuple(t.shape) for role, t in ev.tensors.items()})
