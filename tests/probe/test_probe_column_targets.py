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


class _Tokens(torch.nn.Module):
    """Token rows (batch, tokens, 5) of token ids, each row its own token's (no mixing), with a mask."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(20, 5)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.emb(input_ids)


@pytest.mark.parametrize("pool", ["last", "every"])
def test_a_column_of_one_target_per_item_beside_token_rows_is_the_items_target(pool) -> None:
    """(batch, 1) beside a text batch's (batch, tokens) mask was refused as a per-token target of the wrong
    shape; it is one target per item, given to the item's last token's row (last) or to each of its real
    tokens' rows (every). Reference: the embedding's rows read by index, sklearn's Ridge on them."""
    pytest.importorskip("sklearn")
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model, g, T = _Tokens().eval(), np.random.default_rng(0), 6
    lengths = g.integers(2, T + 1, size=N)
    ids = torch.tensor(g.integers(1, 20, size=(N, T))) * (torch.arange(T)[None] < torch.tensor(lengths)[:, None])
    mask = (ids > 0).long()
    y = torch.tensor(g.normal(size=(N, 1)))
    items = [{"input_ids": ids[i], "attention_mask": mask[i], "y": y[i]} for i in range(N)]
    table = hookrun.probe(model, items, at=["emb"], target="y", method="ridge", pool=pool, batch_size=8,
                          inputs={"input_ids": "input_ids", "attention_mask": "attention_mask"})
    emb = model.emb.weight.detach().double().numpy()
    rows = [(i, j) for i in range(N) for j in range(T) if mask[i, j]] if pool == "every" else \
        [(i, int(lengths[i]) - 1) for i in range(N)]
    x = np.stack([emb[int(ids[i, j])] for i, j in rows])
    t = np.array([float(y[i, 0]) for i, _ in rows])
    _, test_items = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    test = np.isin([i for i, _ in rows], test_items)
    ref = make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(x[~test], t[~test])
    row = table.rows[0]
    assert row["rows"] == len(rows)
    assert row["train"] == pytest.approx(ref.score(x[~test], t[~test]), abs=1e-9)
    assert row["test"] == pytest.approx(ref.score(x[test], t[test]), abs=1e-9)
    weight, bias = table.weights["emb"]
    np.testing.assert_allclose(x @ weight[0] + bias[0], ref.predict(x), rtol=1e-6, atol=1e-9)
