"""A (batch, tokens, dim) output with no token ids or attention mask in the batch (a ViT's patches) is
token rows, every token real, as the similarity kind reads it: pool mean / last / every equal
scikit-learn's Ridge on a raw forward hook's output averaged over the tokens / at the last token / one row
per token; a torch *1d module's (rows, channels, length) stays a 1-d map, averaged over its length."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hookrun

pytest.importorskip("sklearn")
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

N, T, D = 120, 5, 16


class ViTish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Linear(12, D)
        self.block = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D))
        self.conv = nn.Conv1d(T, 7, 3)  # (batch, 7, D - 2): a 1-d map over the tokens as channels

    def forward(self, x):
        h = self.block(self.patch(x))
        return self.conv(h)


def data():
    g = np.random.default_rng(0)
    x = g.normal(size=(N, T, 12)).astype(np.float32)
    v = x[:, :, 0].sum(1) + 0.3 * g.normal(size=N)
    return [{"x": torch.tensor(x[i]), "value": torch.tensor(float(v[i]))} for i in range(N)]


def recorded(model, ds, module):
    out = []
    h = module.register_forward_hook(lambda m, a, o: out.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(torch.stack([d["x"] for d in ds]))
    h.remove()
    return out[0]


def reference(feats, y, rows_per_item=1):
    tr, _ = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    rows = (tr[:, None] * rows_per_item + np.arange(rows_per_item)).reshape(-1)
    return Ridge(alpha=1.0).fit(feats[rows], y[rows])


@pytest.mark.parametrize("pool", ["mean", "last", "every"])
def test_maskless_token_rows_are_pooled_over_the_tokens(pool):
    model, ds = ViTish().eval(), data()
    table = hookrun.probe(model, ds, batch_size=32, inputs=["x"], at=["block", "conv"] if pool == "mean" else "block",
                          target="value", method="ridge", standardize=False, control=False, pool=pool)
    f = recorded(model, ds, model.block)  # (N, T, D)
    y = np.array([float(d["value"]) for d in ds])
    feats, k = {"mean": (f.mean(1), 1), "last": (f[:, -1], 1), "every": (f.reshape(-1, D), T)}[pool]
    ref = reference(feats, np.repeat(y, k), k)
    w, b = table.weights["block"]
    assert w.shape == (1, D) and table[0]["rows"] == N * k
    np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-6, atol=1e-9 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(b[0], ref.intercept_, rtol=1e-6, atol=1e-9)
    if pool == "mean":  # a Conv1d's (batch, channels, length): the mean over its length, one feature a channel
        c = recorded(model, ds, model.conv).mean(2)
        ref = reference(c, y)
        w, _ = table.weights["conv"]
        assert w.shape == (1, 7)
        np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-6, atol=1e-9 * np.abs(ref.coef_).max())


def test_timm_vit_block_is_token_rows():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=8, in_chans=1,
                              num_classes=3).eval()
    g = np.random.default_rng(1)
    x = torch.tensor(g.normal(size=(48, 1, 16, 16)).astype(np.float32))
    ds = [(x[i], torch.tensor(float(x[i].mean()))) for i in range(48)]
    table = hookrun.probe(model, ds, batch_size=16, at="blocks.0", target="label", method="ridge",
                          standardize=False, control=False)
    out = []
    h = model.blocks[0].register_forward_hook(lambda m, a, o: out.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(x)
    h.remove()
    feats, y = out[0].mean(1), x.double().mean((1, 2, 3)).numpy()  # (48, 5 tokens, 192) -> (48, 192)
    tr, _ = train_test_split(np.arange(48), test_size=0.25, random_state=0)
    ref = Ridge(alpha=1.0).fit(feats[tr], y[tr])
    w, _ = table.weights["blocks.0"]
    assert w.shape == (1, 192)
    np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-5, atol=1e-8 * np.abs(ref.coef_).max())


def test_token_rows_of_another_length_than_a_padded_mask_are_refused_before_any_batch(tmp_path):
    """A model that prepends a CLS token gives 11 token rows beside a mask of 10 with padding: which rows are
    padding is not known, and pool mean took them in (the probe reads token rows as the similarity kind
    does, hooks/taps.py token_mask): one line naming both lengths, no file."""
    from similarity_models import Cls, Texts

    cfg = {"data": {"batch_size": 4, "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["enc"], "target": "y", "method": "ridge", "pool": "mean", "control": False}}
    items = [{**Texts(16)[i], "y": torch.tensor(float(i))} for i in range(16)]
    with pytest.raises(hookrun.errors.ConfigError) as err:
        hookrun.run(cfg, model=Cls(), dataset=items)
    assert "its token rows are 11 long and the batch's attention_mask 10" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "p.h5").exists()
    items = [{**Texts(16, padded=16)[i], "y": torch.tensor(float(i))} for i in range(16)]  # no padding: every token
    hookrun.run(cfg, model=Cls(), dataset=items)


class Prepended(nn.Module):
    """(batch, T, 4) -> a CLS row prepended: `enc` gives (batch, T + 1, 8) token rows, and no mask says which."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.p, self.enc, self.cls = nn.Linear(4, 8), nn.Linear(8, 8), nn.Parameter(torch.randn(1, 1, 8))

    def forward(self, x):
        h = self.p(x)
        return self.enc(torch.cat([self.cls.expand(len(h), 1, 8), h], 1))


@pytest.mark.parametrize("pool", ["every", "last"])
def test_a_target_per_token_of_another_length_than_the_token_rows_is_one_line(tmp_path, pool):
    """A maskless output is every token (above), so a per-token target of the batch's T beside T + 1 token rows
    (a CLS) indexed past its end (an IndexError traceback on the first batch): one line naming both, no file."""
    g = torch.Generator().manual_seed(0)
    items = [{"x": torch.randn(5, 4, generator=g), "t": torch.randint(0, 2, (5,), generator=g)} for _ in range(16)]
    cfg = {"data": {"batch_size": 8, "inputs": {"x": "x"}}, "device": "cpu", "progress": False,
           "output": {"path": str(tmp_path / "t.h5")},
           "probe": {"at": ["enc"], "target": "t", "method": "logistic", "pool": pool, "control": False}}
    with pytest.raises(hookrun.errors.ConfigError) as err:
        hookrun.run(cfg, model=Prepended(), dataset=items)
    assert str(err.value).startswith("probe.target gives 5 targets per item (one per token of the batch), but enc's "
                                     "output has 6 token rows")
    assert "\n" not in str(err.value) and not (tmp_path / "t.h5").exists()


class Dropped(nn.Module):
    """Token embeddings with the first token dropped: `enc` gives (rows, LENGTH - 1, WIDTH) beside LENGTH ids."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.e, self.enc = nn.Embedding(50, 8), nn.Linear(8, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.enc(self.e(input_ids)[:, 1:])


def test_every_token_row_of_another_length_than_unpadded_token_ids_is_probed(tmp_path):
    """Without padding every token row is taken (docs/probe.md), also by pool: every where the batch has token
    ids: their identity keys indexed the ids by the output's token slots, past their end (an IndexError
    traceback on the first batch, control or not). Reference: a raw forward hook's 11 rows per text (a CLS
    prepended to 10 tokens), StandardScaler -> sklearn's Ridge over the split's items."""
    from similarity_models import Cls, Texts
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model, texts = Cls().eval(), Texts(24, padded=24)
    y = np.random.default_rng(0).normal(size=len(texts))
    items = [{**texts[i], "y": torch.tensor(y[i])} for i in range(len(texts))]
    cfg = {"data": {"batch_size": 8, "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["enc"], "target": "y", "method": "ridge", "pool": "every", "control": False}}
    hookrun.run(cfg, model=model, dataset=items)
    out = []
    h = model.enc.register_forward_hook(lambda m, a, o: out.append(o.detach().double()))
    with torch.no_grad():
        model(texts.ids)
    h.remove()
    rows, per = out[0].reshape(-1, out[0].shape[2]).numpy(), out[0].shape[1]
    item = np.repeat(np.arange(len(texts)), per)
    _, test_items = train_test_split(np.arange(len(texts)), test_size=0.25, random_state=0)
    test = np.isin(item, test_items)
    ref = make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(rows[~test], y[item][~test])
    with hookrun.open_run(tmp_path / "p.h5") as run:
        row = run.probes().rows[0]
    assert per == 11 and row["rows"] == len(rows)
    assert row["test"] == pytest.approx(ref.score(rows[test], y[item][test]), abs=1e-9)


@pytest.mark.parametrize("model", ["Cls", "Dropped"])
def test_a_control_task_over_token_rows_of_another_length_than_the_token_ids_is_one_line(tmp_path, model):
    """The control task keys each token row to its token id; token rows of another length than the ids (a CLS
    prepended, a token dropped) have no known token: 11 rows over 10 ids were an IndexError traceback, 9 rows
    read other slots' (and the next text's) ids as their identities in silence. One line, no file."""
    from similarity_models import Cls, Texts

    texts = Texts(16, padded=16)
    items = [{**texts[i], "y": torch.tensor(i % 2)} for i in range(len(texts))]
    cfg = {"data": {"batch_size": 8, "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "c.h5")},
           "probe": {"at": ["enc"], "target": "y", "method": "logistic", "pool": "every", "control": True}}
    with pytest.raises(hookrun.errors.ConfigError) as err:
        hookrun.run(cfg, model=Cls() if model == "Cls" else Dropped(), dataset=items)
    rows = 11 if model == "Cls" else 9
    assert str(err.value).startswith(f"probe.control=true with pool: every at enc: its output has {rows} token rows "
                                     f"per item and the batch 10 token ids")
    assert "\n" not in str(err.value) and not (tmp_path / "c.h5").exists()
