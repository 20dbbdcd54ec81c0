"""Patching on models that change tensors in place, each grid compared with a loop of one plain forward
per cell whose patch is a raw torch forward hook (the clean value cloned when its hook fired):

1. blocks of a ModuleList with an in-place residual (`x += f(x); return x`): every block's output is the
   one tensor, changed by each block after it, so the stack's kept outputs (the blocks below a patched
   one return them) must be copies taken when each block returned;
2. a model that changes its input in place (`x.sub_(0.5).mul_(2)`): each forward (clean, corrupted,
   patched) must get the items' inputs as they are, not as an earlier forward left them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from toy_models import in_place_net

import hookrun

N, T, V, D = 3, 5, 11, 8


class ResidualInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += torch.tanh(self.lin(x))
        return x


class StackNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.unembed = nn.Embedding(V, D), nn.Linear(D, V)
        self.blocks = nn.ModuleList([ResidualInPlace() for _ in range(3)])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for b in self.blocks:
            x = b(x)
        return self.unembed(x)




def reference(model: nn.Module, module: nn.Module, clean: torch.Tensor, corrupt: torch.Tensor, cells, metric) -> np.ndarray:
    """One forward of the corrupted input per cell, `module`'s output at the cell's index (a tuple of
    slices) replaced by the clean run's: raw torch hooks, values cloned when the hook fired."""
    kept = {}
    h = module.register_forward_hook(lambda m, a, o: kept.__setitem__("clean", o.detach().clone()))
    with torch.no_grad():
        model(clean.clone())
    h.remove()

    def patch(index):
        def hook(m, a, o):
            o = o.clone()
            o[index] = kept["clean"][index]
            return o
        return hook

    out = []
    for index in cells:
        h = module.register_forward_hook(patch(index))
        with torch.no_grad():
            out.append(metric(model(corrupt.clone())))
        h.remove()
    return np.array(out)


def test_stack_of_in_place_residual_blocks_equals_raw_hooks():
    g = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randint(0, V, (N, T), generator=g), torch.randint(0, V, (N, T), generator=g)
    answer, wrong = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": answer[i], "wrong": wrong[i]} for i in range(N)]
    model = StackNet().eval()
    grid = hookrun.patch_grid(model, items, metric={"name": "logit_diff"},
                              sites={"b": {"at": "blocks.*", "over": ["position"]}})["b"].values

    def metric(logits):
        return float((logits[torch.arange(N), -1, answer] - logits[torch.arange(N), -1, wrong]).mean())

    cells = [(slice(None), p) for p in range(T)]
    want = np.stack([reference(model, b, clean, corrupt, cells, metric) for b in model.blocks])
    np.testing.assert_allclose(grid, want, rtol=0, atol=1e-5)


def test_model_changing_its_input_in_place_equals_raw_hooks():
    g = torch.Generator().manual_seed(3)
    clean, corrupt = torch.rand(N, 3, 2, 2, generator=g), torch.rand(N, 3, 2, 2, generator=g)
    items = [{"clean": clean[i].clone(), "corrupt": corrupt[i].clone(), "answer": torch.tensor(1),
              "wrong": torch.tensor(2)} for i in range(N)]
    grids = hookrun.patch_grid(in_place_net(True), items, input="input", metric={"name": "logit_diff"},
                               sites={"h": {"at": "2", "over": ["feature"], "dims": ["sample", "feature"]}})
    plain = in_place_net(False)  # the same function, out of place: the reference's forwards cannot disturb each other

    def metric(logits):
        return float((logits[:, 1] - logits[:, 2]).mean())

    want = reference(plain, plain[2], clean, corrupt, [(slice(None), j) for j in range(8)], metric)
    np.testing.assert_allclose(grids["h"].values.reshape(-1), want, rtol=0, atol=1e-5)
    with torch.no_grad():
        assert abs(grids["h"].attrs["metric_clean"] - metric(plain(clean))) < 1e-5
        assert abs(grids["h"].attrs["metric_corrupt"] - metric(plain(corrupt))) < 1e-5
