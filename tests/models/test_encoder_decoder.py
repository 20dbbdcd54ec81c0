"""An encoder-decoder's decoder has its own tokens: records, probes and similarity at a decoder module
leave out the decoder's padding (decoder_attention_mask), not the encoder's, checked against raw
forward hooks pooled by numpy and against scikit-learn on those rows (hooks/sides.py)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
N, L = 16, 8


def bart():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.BartConfig(vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                       pad_token_id=0)
    cfg._attn_implementation = "eager"
    model = T.BartModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    ids, dids = torch.randint(3, 50, (N, L), generator=g), torch.randint(3, 50, (N, L), generator=g)
    am, dam = torch.ones(N, L, dtype=torch.long), torch.ones(N, L, dtype=torch.long)
    for i in range(N):  # the same length, other padding: the encoder's mask fits the decoder's shape
        am[i, 4 + i % 4:] = 0
        dam[i, 2 + i % 5:] = 0
    ids[am == 0], dids[dam == 0] = 0, 0
    items = [{"input_ids": ids[i], "attention_mask": am[i], "decoder_input_ids": dids[i],
              "decoder_attention_mask": dam[i], "label": torch.tensor(i % 2)} for i in range(N)]
    raw = {}
    names = ["encoder.layers.1", "decoder.layers.1", "decoder"]
    hooks = [model.get_submodule(n).register_forward_hook(
        lambda m, a, o, n=n: raw.__setitem__(n, (o if isinstance(o, torch.Tensor) else o[0]).detach().double().numpy()))
        for n in names]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=am, decoder_input_ids=dids, decoder_attention_mask=dam)
    for h in hooks:
        h.remove()
    return model, items, raw, am.numpy().astype(bool), dam.numpy().astype(bool)


def mean_over(x, real):
    return (x * real[..., None]).sum(1) / real.sum(1)[:, None]


def test_records_pool_the_decoder_over_its_own_real_tokens(tmp_path):
    import hookrun

    model, items, raw, am, dam = bart()
    hooks = {"m": {"at": ["encoder.layers.1", "decoder.layers.1"], "type": "forward",
                   "actions": [{"name": "record", "what": "output", "reduce": "mean", "dims": "token"}]},
             "d": {"at": "decoder", "type": "forward",  # (the decoder stack itself: a ModelOutput)
                   "actions": [{"name": "record", "what": "output.last_hidden_state", "reduce": "mean", "dims": "token"}]},
             "last": {"at": "decoder.layers.1", "type": "forward",
                      "actions": [{"name": "record", "what": "output", "select": {"dim": "token", "index": "last"}}]}}
    res = hookrun.run({"hooks": hooks, "data": {"batch_size": 8}, "progress": False,
                       "output": {"path": str(tmp_path / "m.h5")}}, model=model, dataset=items)
    with h5py.File(res.path) as f:
        for n, real in (("encoder.layers.1", am), ("decoder.layers.1", dam)):
            np.testing.assert_allclose(f[f"captures/m/{n}/output"][:], mean_over(raw[n], real), atol=1e-6)
        np.testing.assert_allclose(f["captures/d/decoder/output.last_hidden_state"][:], mean_over(raw["decoder"], dam),
                                   atol=1e-6)
        last = dam.sum(1) - 1
        np.testing.assert_allclose(f["captures/last/decoder.layers.1/output"][:],
                                   raw["decoder.layers.1"][np.arange(N), last], atol=1e-6)
    res = hookrun.run({"hooks": {"t": {"at": "decoder.layers.1", "type": "forward",
                                       "actions": [{"name": "record", "what": "output", "rows": "token"}]}},
                       "data": {"batch_size": 8}, "progress": False, "output": {"path": str(tmp_path / "t.h5")}},
                      model=model, dataset=items)
    with h5py.File(res.path) as f:
        np.testing.assert_allclose(f["captures/t/decoder.layers.1/output"][:], raw["decoder.layers.1"][dam], atol=1e-6)
        s, p = np.nonzero(dam)
        assert (f["samples/token_sample"][:] == s).all() and (f["samples/token_position"][:] == p).all()


def test_token_rows_of_encoder_and_decoder_in_one_run_are_one_line(tmp_path):
    import hookrun
    from hookrun.errors import RunError

    model, items, *_ = bart()
    hooks = {"t": {"at": ["encoder.layers.1", "decoder.layers.1"], "type": "forward",
                   "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    with pytest.raises(RunError, match=r"^record rows: token at encoder\.layers\.1 \(the encoder's tokens\) and at "
                                       r"decoder\.layers\.1 \(the decoder's\) in one run: .*record them in two runs$"):
        hookrun.run({"hooks": hooks, "data": {"batch_size": 8}, "progress": False,
                     "output": {"path": str(tmp_path / "t.h5")}}, model=model, dataset=items)


def test_probe_and_similarity_at_the_decoder_equal_sklearn_and_numpy_on_its_real_tokens():
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    import hookrun

    model, items, raw, am, dam = bart()
    table = hookrun.probe(model, items, at=["decoder.layers.1"], target="label", batch_size=8, method="ridge",
                          split={"test": 0.25, "seed": 0}, control=False)
    x, y = mean_over(raw["decoder.layers.1"], dam), np.arange(N) % 2
    train, _ = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    scale = StandardScaler().fit(x[train])
    ref = Ridge(alpha=1.0).fit(scale.transform(x[train]), np.eye(2)[y[train]])
    w, b = table.weights["decoder.layers.1"]
    np.testing.assert_allclose(x @ np.asarray(w).T + np.asarray(b), ref.predict(scale.transform(x)), atol=1e-6)

    def cka(a, c):
        a, c = a - a.mean(0), c - c.mean(0)
        return np.linalg.norm(a.T @ c) ** 2 / (np.linalg.norm(a.T @ a) * np.linalg.norm(c.T @ c))

    sim = hookrun.similarity(model, items, at=["encoder.layers.1", "decoder.layers.1"], batch_size=8, pool="mean")
    enc, dec = mean_over(raw["encoder.layers.1"], am), x
    np.testing.assert_allclose(np.asarray(sim.values)[0, 1], cka(enc, dec), atol=1e-9)
