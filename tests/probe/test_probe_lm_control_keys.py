"""The control task of `pool: every` over a language model's token rows keys each row to its token id
(Hewitt & Liang: one fixed random class per token type, the same in training and test rows, across
batches), wherever the batch holds the ids: under `input_ids` (left-padded texts of unequal lengths),
as the model's first positional input under another key (`data.inputs: [tokens]`, TransformerLens'
`model(tokens)`), or as a tuple item's ids. The latter two keyed the rows to their items: each text's
tokens one class, so the held-out texts' control was chance (0.57 against 0.83 here) and the
selectivity +0.09 where it is -0.18. Reference: scikit-learn's LogisticRegression on a raw forward
hook's rows of each text run alone, with the control classes drawn per token id by numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun

pytest.importorskip("sklearn")
transformers = pytest.importorskip("transformers")
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

N, T, V = 48, 8, 20


def tok_target(batch):
    return batch["y"]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=2, n_positions=16, bos_token_id=0,
                                  eos_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.GPT2Model(cfg).eval()


def texts(equal: bool):
    """Each text's token ids and per-token classes (the id's parity, a fifth of them flipped)."""
    g = np.random.default_rng(1)
    lengths = np.full(N, T) if equal else g.integers(3, T + 1, size=N)
    ids = [g.integers(1, V, size=n) for n in lengths]
    return ids, [(i % 2) ^ (g.random(len(i)) < 0.2).astype(np.int64) for i in ids]


def reference(model, ids, ys):
    """(test accuracy, control test accuracy) of scikit-learn on each text's rows, run alone."""
    rows = []
    h = model.h[1].register_forward_hook(lambda m, a, o: rows.append((o[0] if isinstance(o, tuple) else o)[0].double().numpy()))
    with torch.no_grad():
        for i in ids:
            model(torch.tensor(i)[None])
    h.remove()
    train_items = train_test_split(np.arange(N), test_size=0.25, random_state=0)[0]
    x, y, key = np.concatenate(rows), np.concatenate(ys), np.concatenate(ids)
    train = np.isin(np.repeat(np.arange(N), [len(i) for i in ids]), train_items)
    uniq, inverse = np.unique(key, return_inverse=True)  # one class per token id, drawn as docs/probe.md says
    freq = np.bincount(y[train], minlength=2).astype(np.float64)
    control = np.random.default_rng(0).choice(2, size=len(uniq), p=freq / freq.sum())[inverse]
    scaler = StandardScaler().fit(x[train])
    xs = scaler.transform(x)
    out = []
    for t in (y, control):
        lr = LogisticRegression(C=1.0, solver="lbfgs", tol=1e-10, max_iter=10000).fit(xs[train], t[train])
        out.append(lr.score(xs[~train], t[~train]))
    return out, int((~train).sum())


def items(how: str, ids, ys):
    if how == "tuple":  # (ids, per-token classes): model(ids), the target the item's second part
        return [(torch.tensor(i), torch.tensor(y)) for i, y in zip(ids, ys, strict=True)]
    if how == "positional":  # {tokens, y}: model(tokens)
        return [{"tokens": torch.tensor(i), "y": torch.tensor(y)} for i, y in zip(ids, ys, strict=True)]
    out = []  # left-padded input_ids and attention_mask, texts of unequal lengths
    for i, y in zip(ids, ys, strict=True):
        pad = T - len(i)
        out.append({"input_ids": torch.tensor(np.r_[np.zeros(pad, np.int64), i]),
                    "attention_mask": torch.tensor(np.r_[np.zeros(pad, np.int64), np.ones(len(i), np.int64)]),
                    "y": torch.tensor(np.r_[np.zeros(pad, np.int64), y])})
    return out


@pytest.mark.parametrize("how", ["tuple", "positional", "left_padded"])
def test_every_token_row_keys_its_control_class_to_its_token_id(model, how) -> None:
    ids, ys = texts(equal=how != "left_padded")
    (test, control), n_test = reference(model, ids, ys)
    inputs = {"tuple": None, "positional": ["tokens"],
              "left_padded": {"input_ids": "input_ids", "attention_mask": "attention_mask"}}[how]
    target = "label" if how == "tuple" else {"_target_": f"{__name__}.tok_target"}
    table = hookrun.probe(model, items(how, ids, ys), batch_size=10, inputs=inputs, at=["h.1"], target=target,
                          pool="every", control=True)
    row = table[0]
    assert row["rows"] == sum(len(i) for i in ids)
    assert row["test"] == pytest.approx(test, abs=1 / n_test + 1e-12)  # (the two optima may part on one row)
    assert row["control"] == pytest.approx(control, abs=1 / n_test + 1e-12)
    assert row["selectivity"] == pytest.approx(row["test"] - row["control"], abs=1e-12)
