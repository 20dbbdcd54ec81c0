"""Models for the similarity runs' tests: a second image model with its own weights, a module with no
feature axis, a module whose rows are not the batch's, a module that runs twice in a forward, a layer
that is dead (constant), and convs whose outputs the next op rectifies in place."""

from __future__ import annotations

import torch
from torch import nn


def seeded_cnn(seed: int = 1) -> nn.Module:
    """The shipped TinyCNN's architecture with random weights drawn after torch.manual_seed(seed)."""
    from hookrun.models.tiny_cnn import TinyCNN

    torch.manual_seed(seed)
    return TinyCNN().eval()


class Total(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1)


class Scored(nn.Module):
    """`score` gives one value per item (no feature axis); `pairs` gives two rows per item."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.score = Total()
        self.pairs = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return self.score(h) + self.pairs(h.reshape(-1, 2)).sum()


class Looped(nn.Module):
    """`lin` runs twice in a forward (a shared module, as a looped or weight-tied block)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.lin(x))


class Lengths(torch.utils.data.Dataset):
    """Sequences of 3 features, 5 steps long for items 0-3 and 7 for items 4-7 (batches of 4: no padding)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.linspace(-1, 1, (5 if i < 4 else 7) * 3).reshape(-1, 3) * (i + 1)


def token_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4)).eval()


def dead_mlp() -> nn.Module:
    """Linear -> ReLU -> Linear whose first bias is -100: the ReLU gives 0 for every item, and the last
    layer its bias (both constant)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    return model


def rectified_cnn() -> nn.Module:
    """conv -> ReLU(inplace=True) twice (torchvision's conv -> bn -> ReLU(inplace=True)): each conv's output,
    as its forward hook sees it, is rectified in place by the next op once the hook has returned."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3, padding=1),
                         nn.ReLU(inplace=True)).eval()
