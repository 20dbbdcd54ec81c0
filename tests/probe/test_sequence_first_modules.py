"""probe, similarity and top_examples at a sequence-first module (batch_first=False: nn.TransformerEncoderLayer,
nn.LSTM), whose output is (tokens, batch, features): each item's row pools its own tokens. They pooled
axis 1, the batch: a probe of T rows per batch (each the batch's mean at one position), fitted against
the first T items' labels, without a word. References: scikit-learn's Ridge and numpy's linear CKA on
the outputs of raw forward hooks, transposed to (batch, tokens, features) and averaged over the tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hookrun

pytest.importorskip("sklearn")
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

N, B = 48, 16


class SequenceFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(3, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=False)
        self.rnn = nn.LSTM(8, 6)  # (batch_first=False)
        self.fc = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (batch, tokens, 3)
        h = self.enc(self.inp(x).transpose(0, 1))  # (tokens, batch, 8)
        return self.fc(self.rnn(h)[0].mean(0))


@pytest.mark.parametrize("tokens", [5, B])  # (B tokens: a (T, B, D) output whose shape says nothing)
def test_probe_and_similarity_pool_each_items_tokens(tmp_path, tokens):
    model = SequenceFirst().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, tokens, 3, generator=g)
    value = x[:, :, 0].mean(1) * 2 + 0.5
    data = [{"x": x[i], "value": value[i]} for i in range(N)]
    kept = {}
    hooks = [getattr(model, m).register_forward_hook(lambda mod, a, o, m=m: kept.update({m: o[0] if isinstance(o, tuple) else o}))
             for m in ("enc", "rnn")]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    feats = {m: t.detach().double().transpose(0, 1).mean(1).numpy() for m, t in kept.items()}  # (N, features)

    cfg = {"data": {"batch_size": B, "inputs": ["x"]}, "device": "cpu", "progress": False,
           "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["enc", "rnn"], "target": "value", "method": "ridge", "alpha": 1.0, "pool": "mean",
                     "standardize": False, "control": False, "split": {"test": 0.25, "seed": 0}}}
    hookrun.run(cfg, model=model, dataset=data)
    y = value.double().numpy()
    tr, te = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    with hookrun.open_run(tmp_path / "p.h5") as run:
        for row, m in zip(run.probes(), ("enc", "rnn"), strict=True):
            ref = Ridge(alpha=1.0).fit(feats[m][tr], y[tr])
            w, b = run.probe_weights(m)
            assert row["rows"] == N
            np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-6, atol=1e-9 * np.abs(ref.coef_).max())
            assert row["test"] == pytest.approx(ref.score(feats[m][te], y[te]), rel=1e-6)

    cfg = {"data": {"batch_size": B, "inputs": ["x"]}, "device": "cpu", "progress": False,
           "output": {"path": str(tmp_path / "s.h5")}, "similarity": {"at": ["inp", "enc", "rnn"], "pool": "mean"}}
    hookrun.run(cfg, model=model, dataset=data)
    with torch.no_grad():
        feats["inp"] = model.inp(x).double().mean(1).numpy()
    grams = [feats[m] @ feats[m].T for m in ("inp", "enc", "rnn")]
    n = N
    h = np.eye(n) - 1.0 / n

    def hsic(k, l_):
        return np.trace(k @ h @ l_ @ h)

    want = np.array([[hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_)) for l_ in grams] for k in grams])
    with hookrun.open_run(tmp_path / "s.h5") as run:
        np.testing.assert_allclose(run.similarity().values, want, rtol=1e-6)


@pytest.mark.parametrize("tokens", [5, B])
def test_top_examples_at_a_sequence_first_module_name_the_sample_and_its_token(tmp_path, tokens):
    """top_examples read a (tokens, batch, features) output as (batch, tokens, ...): the top value of
    sample 4's first token came back as sample 0's token 4. Reference: a raw forward hook's output,
    transposed, and torch.topk over every (sample, token) of the data set."""
    model = SequenceFirst().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, tokens, 3, generator=g)
    hooks = {"t": {"at": "enc", "type": "forward", "actions": [{"name": "top_examples", "k": 3}]}}
    hookrun.run({"data": {"batch_size": B, "inputs": ["x"]}, "device": "cpu", "progress": False,
                 "output": {"path": str(tmp_path / "t.h5")}, "hooks": hooks},
                model=model, dataset=[{"x": x[i], "label": 0} for i in range(N)])
    kept = {}
    h = model.enc.register_forward_hook(lambda mod, a, o: kept.update(o=o))
    with torch.no_grad():
        model(x)
    h.remove()
    out = kept["o"].transpose(0, 1)  # (N, tokens, 8)
    with hookrun.open_run(tmp_path / "t.h5") as run:
        for f in (0, 5):
            top = torch.topk(out[:, :, f].flatten(), 3)
            want = [(int(i) // tokens, int(i) % tokens) for i in top.indices]
            got = run.top_examples("enc", f)
            assert [(e["sample"], e["position"]) for e in got] == want
            np.testing.assert_allclose([e["value"] for e in got], top.values.numpy(), rtol=1e-6)
