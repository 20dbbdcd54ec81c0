"""Token rows of a language model over padded batches of texts of unequal lengths, left and right padded:
the probe's `pool: last / mean / every` and the similarity's `pool: mean` equal the rows of a raw forward
hook on each text run alone, unpadded (a small LLaMA built offline from its config: rotary positions, so
left padding leaves the real tokens' values as they are), fitted by scikit-learn's Ridge or compared by
numpy's linear CKA. An item with no real token is refused in one line naming it: pooling over its real
tokens has no value, and a padding token's row (last) or zeros (mean) had entered the fit in its place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import RunError

pytest.importorskip("sklearn")
transformers = pytest.importorskip("transformers")
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

N, T, V = 24, 9, 30
INPUTS = {"input_ids": "input_ids", "attention_mask": "attention_mask"}


def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    cfg._attn_implementation = "eager"
    return transformers.LlamaModel(cfg).eval()


def texts():
    g = np.random.default_rng(0)
    seqs = [torch.tensor(g.integers(3, V, size=n)) for n in g.integers(2, T + 1, size=N)]
    return seqs, g.normal(size=N), [g.normal(size=len(s)) for s in seqs]


def items(side: str, empty: int | None = None):
    seqs, value, per_token = texts()
    out = []
    for i, s in enumerate(seqs):
        ids, mask, tok = torch.zeros(T, dtype=torch.long), torch.zeros(T, dtype=torch.long), torch.full((T,), 99.0)
        at = slice(0, len(s)) if side == "right" else slice(T - len(s), T)
        if i != empty:
            ids[at], mask[at], tok[at] = s, 1, torch.tensor(per_token[i], dtype=torch.float32)
        out.append({"input_ids": ids, "attention_mask": mask, "value": torch.tensor(float(value[i])), "tok": tok})
    return out


def token_target(batch):
    return batch["tok"]


def alone(model, module):
    """The module's output (tokens, features) for each text run alone, unpadded, through a raw hook."""
    seqs, out = texts()[0], []
    h = module.register_forward_hook(lambda m, a, o: out.append((o[0] if isinstance(o, tuple) else o)[0].double().numpy()))
    with torch.no_grad():
        for s in seqs:
            model(input_ids=s[None])
    h.remove()
    return out


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("pool", ["last", "mean", "every"])
def test_token_pools_equal_ridge_on_each_text_run_alone(side, pool) -> None:
    model = llama()
    rows = alone(model, model.layers[1])
    _, value, per_token = texts()
    train, _ = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    if pool == "every":  # one row per real token, each with its own target ({_target_: fn} gives (batch, tokens))
        x, y = np.concatenate([rows[i] for i in train]), np.concatenate([per_token[i] for i in train])
        target, want = {"_target_": f"{__name__}.token_target"}, sum(len(r) for r in rows)
    else:
        x = np.stack([rows[i][-1] if pool == "last" else rows[i].mean(0) for i in train])
        y, target, want = value[train], "value", N
    ref = Ridge(alpha=1.0).fit(x, y)
    table = hookrun.probe(model, items(side), batch_size=7, inputs=INPUTS, at=["layers.1"], target=target,
                          method="ridge", standardize=False, control=False, pool=pool)
    w, b = table.weights["layers.1"]
    assert table[0]["rows"] == want
    np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-5, atol=1e-6 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(b[0], ref.intercept_, rtol=1e-5, atol=1e-7)


def cka(x, y):
    x, y = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


@pytest.mark.parametrize("side", ["right", "left"])
def test_similarity_mean_over_the_real_tokens_equals_numpy_on_each_text_alone(side) -> None:
    model = llama()
    means = [np.stack([r.mean(0) for r in alone(model, m)]) for m in (model.layers[0], model.layers[1])]
    m = hookrun.similarity(model, items(side), at=["layers.0", "layers.1"], batch_size=7, inputs=INPUTS, pool="mean")
    np.testing.assert_allclose(m.values[0, 1], cka(*means), rtol=1e-7)


@pytest.mark.parametrize("pool", ["last", "mean", "max"])
def test_an_item_with_no_real_token_is_one_line_naming_it(pool) -> None:
    """Item 10 all padding: pool=last took its padding token at position 0 as its row, mean a row of zeros
    (both fitted without a word), max -inf (called an overflow); pool=every gives it no row and runs."""
    with pytest.raises(RunError) as err:
        hookrun.probe(llama(), items("right", empty=10), batch_size=7, inputs=INPUTS, at=["layers.1"], target="value",
                      method="ridge", standardize=False, control=False, pool=pool)
    assert str(err.value).startswith(f"probe.at: layers.1: item(s) [10] of this batch have no real token (attention_mask "
                                     f"all 0), so pool={pool} over their real tokens has no value")
    assert "\n" not in str(err.value)
    table = hookrun.probe(llama(), items("right", empty=10), batch_size=7, inputs=INPUTS, at=["layers.1"],
                          target="value", method="ridge", standardize=False, control=False, pool="every")
    assert table[0]["rows"] == sum(len(r) for i, r in enumerate(texts()[0]) if i != 10)
    with pytest.raises(RunError, match=r"^similarity.at: layers.0: item\(s\) \[10\] of this batch have no real token"):
        hookrun.similarity(llama(), items("left", empty=10), at=["layers.0", "layers.1"], batch_size=7, inputs=INPUTS,
                           pool="mean")
