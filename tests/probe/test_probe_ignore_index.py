"""A token-classification data set labels the tokens it does not score -100 (Hugging Face's
ignore_index: sub-word continuations, special tokens): a probe with one class per token leaves those
tokens out, as padding, with `pool: every` and `last`. They were fitted as a class of their own
(-100, the most common here), which raised the accuracy without a word. Reference: scikit-learn's
LogisticRegression on a raw forward hook's rows of each text run alone, the -100 tokens dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun

pytest.importorskip("sklearn")
pytest.importorskip("transformers")
from gpt2_rows import TOKEN_TARGET, VOCAB, rows_alone, tiny_gpt2_model  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

N, T, V = 60, 8, VOCAB


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2_model()


def data():
    """Right-padded texts; each token's class is its id's parity, or -100 for ids under 8 (unscored);
    texts 0 to 5 (the first batch) score no token at all."""
    g = np.random.default_rng(2)
    ids = [g.integers(1, V, size=n) for n in g.integers(3, T + 1, size=N)]
    ids[:6] = [g.integers(1, 8, size=4) for _ in range(6)]
    ys = [np.where(i < 8, -100, i % 2) for i in ids]
    items = []
    for i, y in zip(ids, ys, strict=True):
        pad = T - len(i)
        items.append({"input_ids": torch.tensor(np.r_[i, np.zeros(pad, int)]), "attention_mask": torch.tensor(
            np.r_[np.ones(len(i), int), np.zeros(pad, int)]), "y": torch.tensor(np.r_[y, np.full(pad, 7)])})
    return ids, ys, items


@pytest.mark.parametrize("pool", ["every", "last"])
def test_tokens_labelled_minus_100_are_left_out_as_padding(model, pool):
    ids, ys, items = data()
    rows = rows_alone(model, ids)
    if pool == "last":
        rows, ys = [r[-1:] for r in rows], [y[-1:] for y in ys]
    scored = np.array([i for i in range(N) if (ys[i] != -100).any()])  # (the split is over the items with rows)
    train, test = train_test_split(scored, test_size=0.25, random_state=0)
    pick = [(np.concatenate([rows[i][ys[i] != -100] for i in part]), np.concatenate([ys[i][ys[i] != -100] for i in part]))
            for part in (train, test)]
    (xtr, ytr), (xte, yte) = pick
    ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(xtr, ytr)
    table = hookrun.probe(model, items, batch_size=6, inputs={"input_ids": "input_ids", "attention_mask": "attention_mask"}, at=["h.1"],
                          target=TOKEN_TARGET, method="logistic", standardize=False,
                          control=False, pool=pool)
    (row,) = table
    assert row["rows"] == len(ytr) + len(yte) and set(np.unique(ytr)) == {0, 1}
    assert row["train"] == pytest.approx(ref.score(xtr, ytr), abs=1e-12)
    assert row["test"] == pytest.approx(ref.score(xte, yte), abs=1e-12)
    w, b = table.weights["h.1"]
    assert w.shape[0] == 1  # two classes: -100 is no class of the probe
    np.testing.assert_allclose(w[0], ref.coef_[0], rtol=1e-4, atol=1e-5 * np.abs(ref.coef_).max())
