"""The control task over a language model's token rows (`pool: every`, and `last`: each row one token)
keys each row to its token id (Hewitt & Liang: one fixed random class per token type, the same in
training and test rows, across batches), wherever the batch holds the ids: under `input_ids`
(left-padded texts of unequal lengths), as the model's first positional input under another key
(`data.inputs: [tokens]`, TransformerLens' `model(tokens)`), or as a tuple item's ids; and in
probe.test_data's rows too. The positional and tuple ids, and every `last` row, were keyed to their
items: a held-out text's identity is never trained on, so its control was chance whatever the layer
and the selectivity too high. Reference: scikit-learn's LogisticRegression on a raw forward hook's rows
of each text run alone, with the control classes drawn per token id by numpy."""

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
from sklearn.preprocessing import StandardScaler  # noqa: E402

N, T, V = 120, 8, VOCAB


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2_model()


def texts(equal: bool):
    """Each text's token ids and per-token classes (the id's parity, a fifth of them flipped)."""
    g = np.random.default_rng(1)
    lengths = np.full(N, T) if equal else g.integers(3, T + 1, size=N)
    ids = [g.integers(1, V, size=n) for n in lengths]
    return ids, [(i % 2) ^ (g.random(len(i)) < 0.2).astype(np.int64) for i in ids]


def reference(model, ids, ys, pool="every", test_items=None, by_item=False):
    """(test accuracy, control test accuracy, test rows) of scikit-learn on each text's rows run alone
    (every token, or its last), the texts `test_items` (default: train_test_split's) held out; the control
    keyed to the token ids, or to the texts (`by_item`)."""
    rows = rows_alone(model, ids)
    if test_items is None:
        test_items = train_test_split(np.arange(N), test_size=0.25, random_state=0)[1]
    if pool == "last":
        rows, ys, ids = [r[-1:] for r in rows], [y[-1:] for y in ys], [i[-1:] for i in ids]
    x, y, key = np.concatenate(rows), np.concatenate(ys), np.concatenate(ids)
    train = ~np.isin(np.repeat(np.arange(N), [len(i) for i in ids]), test_items)
    if by_item:
        key = np.repeat(np.arange(N), [len(i) for i in ids])
    uniq, inverse = np.unique(key, return_inverse=True)  # one class per token id, drawn as docs/probe.md says
    freq = np.bincount(y[train], minlength=2).astype(np.float64)
    control = np.random.default_rng(0).choice(2, size=len(uniq), p=freq / freq.sum())[inverse]
    scaler = StandardScaler().fit(x[train])
    xs = scaler.transform(x)
    out = []
    for t in (y, control):
        lr = LogisticRegression(C=1.0, solver="lbfgs", tol=1e-10, max_iter=10000).fit(xs[train], t[train])
        out.append(lr.score(xs[~train], t[~train]))
    return out[0], out[1], int((~train).sum())


def items(how: str, ids, ys):
    if how == "tuple":  # (ids, per-token classes): model(ids), the target the item's second part
        return [(torch.tensor(i), torch.tensor(y)) for i, y in zip(ids, ys, strict=True)]
    if how == "positional":  # {tokens, y}: model(tokens)
        return [{"tokens": torch.tensor(i), "y": torch.tensor(y)} for i, y in zip(ids, ys, strict=True)]
    out = []  # left-padded input_ids and attention_mask, texts of unequal lengths
    for i, y in zip(ids, ys, strict=True):
        pad = T - len(i)
        out.append({"input_ids": torch.tensor(np.r_[np.zeros(pad, np.int64), i]), "last": torch.tensor(y[-1]),
                    "attention_mask": torch.tensor(np.r_[np.zeros(pad, np.int64), np.ones(len(i), np.int64)]),
                    "y": torch.tensor(np.r_[np.zeros(pad, np.int64), y])})
    return out


def check(row, test, control, n_test, rows):
    assert row["rows"] == rows
    assert row["test"] == pytest.approx(test, abs=1 / n_test + 1e-12)  # (the two optima may part on one row)
    assert row["control"] == pytest.approx(control, abs=1 / n_test + 1e-12)
    assert row["selectivity"] == pytest.approx(row["test"] - row["control"], abs=1e-12)


LEFT = {"input_ids": "input_ids", "attention_mask": "attention_mask"}


@pytest.mark.parametrize("how", ["tuple", "positional", "left_padded"])
def test_every_token_row_keys_its_control_class_to_its_token_id(model, how) -> None:
    ids, ys = texts(equal=how != "left_padded")
    test, control, n_test = reference(model, ids, ys)
    inputs = {"tuple": None, "positional": ["tokens"], "left_padded": LEFT}[how]
    table = hookrun.probe(model, items(how, ids, ys), batch_size=10, inputs=inputs, at=["h.1"],
                          target="label" if how == "tuple" else TOKEN_TARGET, pool="every", control=True)
    check(table[0], test, control, n_test, sum(len(i) for i in ids))


def test_a_last_token_row_keys_its_control_class_to_its_token_id(model) -> None:
    """(Keyed to the text, the held-out texts' control was 0.50, chance, for 0.90 keyed to the last token's id.)"""
    ids, ys = texts(equal=False)
    test, control, n_test = reference(model, ids, ys, pool="last")
    table = hookrun.probe(model, items("left_padded", ids, ys), batch_size=10, inputs=LEFT, at=["h.1"], target=TOKEN_TARGET,
                          pool="last", control=True)
    check(table[0], test, control, n_test, N)


@pytest.mark.parametrize("pool", ["every", "last"])
def test_test_datas_token_rows_share_the_training_rows_token_ids(model, pool) -> None:
    """probe.test_data's last-token rows were keyed to items of their own (the control 0.53, for 0.93)."""
    ids, ys = texts(equal=False)
    held = np.arange(N - 30, N)
    test, control, n_test = reference(model, ids, ys, pool=pool, test_items=held)
    data = items("left_padded", ids, ys)
    table = hookrun.probe(model, data[:N - 30], test_data=data[N - 30:], batch_size=10, inputs=LEFT, at=["h.1"],
                          target=TOKEN_TARGET, pool=pool, control=True)
    check(table[0], test, control, n_test, N if pool == "last" else sum(len(i) for i in ids))


def test_a_last_token_row_of_an_item_target_keys_its_control_class_to_its_item(model) -> None:
    """A target per item (a text's label read at its last token) is the text's, not a token type's: its control
    stays keyed to the text, as `mean`'s is (keyed to the last token's id, texts that end alike would share one
    control class whatever the layer)."""
    ids, ys = texts(equal=False)
    test, control, n_test = reference(model, ids, ys, pool="last", by_item=True)
    table = hookrun.probe(model, items("left_padded", ids, ys), batch_size=10, inputs=LEFT, at=["h.1"], target="last",
                          pool="last", control=True)
    check(table[0], test, control, n_test, N)
