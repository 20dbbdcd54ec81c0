"""Models for the similarity runs' tests: a second image model with its own weights, a module with no
feature axis, a module whose rows are not the batch's, a module that runs twice in a forward, a layer
that is dead (constant), convs whose outputs the next op rectifies in place, and a token model that
prepends a CLS token (Cls, over Texts: token rows one longer than the batch's attention mask)."""

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


LENGTH, WIDTH = 10, 8


class Cls(torch.nn.Module):
    """Token embeddings (rows, LENGTH, WIDTH), then a CLS token prepended: `enc` gives (rows, LENGTH + 1, WIDTH)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.e, self.enc = torch.nn.Embedding(50, WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, WIDTH))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.e(input_ids)
        return torch.tanh(self.enc(torch.cat([self.cls.expand(len(h), 1, WIDTH), h], 1)))


class Texts(torch.utils.data.Dataset):
    """`n` texts of LENGTH tokens; those from item `padded` on end in 1 to 6 padding tokens."""

    def __init__(self, n: int = 16, padded: int = 0) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 50, (n, LENGTH), generator=g)
        self.mask = torch.ones(n, LENGTH, dtype=torch.long)
        for i in range(padded, n):
            self.mask[i, LENGTH - 1 - i % 6:] = 0
        self.ids[self.mask == 0] = 0

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


def narrow_mlp(raise_at: int = 0) -> nn.Module:
    """Linear(5, 3) -> ReLU: a second model whose inputs are 5 wide (6-wide items make its forward raise);
    `raise_at`: its forward raises the model's own RuntimeError at that call (1-based), 0 never."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.ReLU()).eval()
    if raise_at:
        from toy_models import raising_at

        raising_at(model, raise_at, RuntimeError("the second model's own error"))
    return model
