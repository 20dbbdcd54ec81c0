"""A DataLoader given as the data set is one line naming loader.dataset, before any forward. The line
said to give list(itertools.islice(data, N)), which makes each of the loader's batches one item: on an
MLP (a Linear reads the last axis) that ran without an error and gave a CKA of 0.930 where the items'
is 0.815. The data set it names equals numpy's linear CKA of the submodules called directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError


def _cka(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(0), b - b.mean(0)
    return float(np.linalg.norm(a.T @ b) ** 2 / (np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b)))


def test_a_dataloader_is_one_line_naming_its_dataset_which_gives_numpys_cka():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    x = torch.randn(48, 5, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(x, batch_size=8)
    seen = []
    h = model.register_forward_hook(lambda *a: seen.append(1))
    for call in (lambda: hookrun.similarity(model, loader, at=["0", "2"]),
                 lambda: hookrun.probe(model, loader, at=["0"])):
        with pytest.raises(ConfigError, match=r"^run\(dataset=\.\.\.\): got a DataLoader, whose items are batches; give "
                                              r"the data set it reads, loader\.dataset "):
            call()
    h.remove()
    assert not seen

    m = hookrun.similarity(model, loader.dataset, at=["0", "2"], batch_size=8)
    with torch.no_grad():
        first, last = model[0](x).double().numpy(), model(x).double().numpy()
    assert m.values[0, 1] == pytest.approx(_cka(first, last), rel=1e-6)
