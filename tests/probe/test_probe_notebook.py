"""hookrun.probe (the probe kind's notebook function) on a live model and data set: the probe equals
scikit-learn's Ridge on features a raw forward hook records; the model comes back in its mode; a bad
block is one line before any batch (hookrun.similarity: tests/similarity/test_similarity_notebook.py)."""

from __future__ import annotations

import numpy as np
import pytest

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("sklearn")
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from test_probe_kind import N, Net, data, recorded  # noqa: E402


def test_probe_returns_the_table_and_weights_equal_to_sklearn():
    model, ds = Net().train(), data()
    table = hookrun.probe(model, ds, batch_size=16, inputs=["x"], at="conv", target="value", method="ridge",
                          alpha=2.0, standardize=False, control=False)
    assert model.training  # (back in the mode it went in)
    model.eval()
    feats = recorded(model, ds, model.conv).mean((2, 3))
    y = np.array([float(d["value"]) for d in ds])
    tr, te = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    ref = Ridge(alpha=2.0).fit(feats[tr], y[tr])
    w, b = table.weights["conv"]
    np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-6, atol=1e-9 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(feats[te] @ w[0] + b[0], ref.predict(feats[te]), rtol=1e-6)
    assert table.column("at") == ["conv"] and table[0]["test"] == pytest.approx(ref.score(feats[te], y[te]), rel=1e-6)
    assert "conv" in str(table)


def test_a_bad_block_is_one_line_before_any_batch():
    model, seen = Net().eval(), []
    h = model.register_forward_hook(lambda *a: seen.append(1))
    with pytest.raises(ConfigError, match="probe.split.test"):
        hookrun.probe(model, data(), inputs=["x"], at="conv", target="label", split={"test": 1.5})
    with pytest.raises(ConfigError, match="expected a torch.nn.Module"):
        hookrun.similarity("not a model", data(), at=["conv"])
    h.remove()
    assert not seen
