"""A target of shape (batch, 1) (a data set returning y as a 1-element tensor) is one target per item,
as scikit-learn takes y of shape (n, 1): it was refused as one target per token, with the advice
`pool: every`, which a feature map then refused. The reference: sklearn's StandardScaler -> Ridge /
LogisticRegression on the mean-pooled conv output computed by the module called directly, split by
train_test_split over the item indices."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import hookrun

N = 40


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU())
    x = torch.randn(N, 3, 6, 6)
    with torch.no_grad():
        z = model[0](x).double().mean((2, 3)).numpy()
    return model, x, z


@pytest.mark.parametrize("method", ["ridge", "logistic"])
def test_a_column_of_one_target_per_item_is_probed_as_sklearn_fits_it(method) -> None:
    pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model, x, z = _setup()
    y = torch.randn(N, 1, dtype=torch.float64) if method == "ridge" else (torch.arange(N) % 3)[:, None]
    table = hookrun.probe(model, TensorDataset(x, y), at=["0"], target="label", method=method, batch_size=10,
                          control=False)
    _, test_items = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    test = np.isin(np.arange(N), test_items)
    estimator = Ridge(alpha=1.0) if method == "ridge" else LogisticRegression(C=1.0, tol=1e-10, max_iter=10000)
    ref = make_pipeline(StandardScaler(), estimator).fit(z[~test], y.numpy()[~test, 0])
    row = table.rows[0]
    assert row["train"] == pytest.approx(ref.score(z[~test], y.numpy()[~test, 0]), abs=1e-9)
    assert row["test"] == pytest.approx(ref.score(z[test], y.numpy()[test, 0]), abs=1e-9)
