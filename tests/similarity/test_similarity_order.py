"""The matrix's rows and columns are in the order the hook points' outputs come in the forward, as probe's
depth order (a block's output after the modules inside it): named_modules lists transformer.h.0 before its
attn and mlp, so at [transformer.h.0, transformer.h.0.attn, transformer.h.0.mlp] was drawn, printed and
returned with the block's output (which comes after its MLP) as the shallowest row. Reference: the order
raw forward hooks on the same modules fire in, and numpy's linear CKA of their outputs averaged over the
real tokens. A file written before keeps the order it stored (its readers show its labels)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from test_similarity_engine import cka
from test_similarity_runs import cfg, file_matrix, grams

import hookrun
from hookrun.analysis.kind_readers import kind_figures, kind_lines

pytest.importorskip("transformers")

AT = ["transformer.h.0", "transformer.h.0.mlp", "transformer.wte", "transformer.h.0.attn"]
FIRED = ["transformer.wte", "transformer.h.0.attn", "transformer.h.0.mlp", "transformer.h.0"]


def raw(model: torch.nn.Module, names: list[str], items: list[dict]) -> tuple[list[str], dict[str, np.ndarray]]:
    """The order raw forward hooks fire in, and each module's output averaged over the real tokens."""
    ids, mask = torch.stack([i["input_ids"] for i in items]), torch.stack([i["attention_mask"] for i in items])
    fired, outs = [], {}

    def hook(name):
        def keep(mod, inputs, out):
            fired.append(name)
            outs[name] = (out[0] if isinstance(out, tuple) else out).double()
        return keep

    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    for h in handles:
        h.remove()
    m = mask.double().unsqueeze(-1)
    return fired, {n: ((o * m).sum(1) / m.sum(1)).numpy() for n, o in outs.items()}


def test_rows_and_columns_are_in_the_order_the_outputs_come(tmp_path) -> None:
    from toy_lm import Prompts, tiny_gpt2

    data = {"dataset": {"_target_": "toy_lm.Prompts", "n": 9}, "batch_size": 4}
    model = {"_target_": "toy_lm.tiny_gpt2"}
    second = {"model": {"_target_": "toy_lm.tiny_gpt2", "seed": 1}, "at": AT}
    fired, feats = raw(tiny_gpt2(), AT, Prompts(n=9).items)
    _, other = raw(tiny_gpt2(seed=1), AT, Prompts(n=9).items)
    assert fired == FIRED
    k, l_ = grams([feats[n] for n in fired]), grams([other[n] for n in fired])

    path = hookrun.run(cfg(tmp_path / "s.h5", model=model, data=data, at=AT, pool="mean")).path
    got, meta = file_matrix(path)
    assert meta["rows"] == meta["cols"] == FIRED
    np.testing.assert_allclose(got, [[cka(a, b) for b in k] for a in k], rtol=1e-6)
    with hookrun.open_run(path) as run:
        assert list(run.similarity().coords["at"].values) == FIRED
        [(_, spec)] = kind_figures(run)
        assert list(spec.y) == list(spec.x) == FIRED
        table = [line.split() for line in kind_lines(run.file) if line.strip().startswith("transformer.")]
        assert table[0] == FIRED and [row[0] for row in table[1:]] == FIRED  # (the header: the columns)

    path = hookrun.run(cfg(tmp_path / "w.h5", model=model, data=data, at=AT, pool="mean", **{"with": second})).path
    got, meta = file_matrix(path)
    assert meta["rows"] == meta["cols"] == FIRED
    np.testing.assert_allclose(got, [[cka(a, b) for b in l_] for a in k], rtol=1e-6)

    with h5py.File(path, "r+") as f:  # as hookrun wrote it before: rows and columns in named_modules' order
        order = [FIRED.index(n) for n in ["transformer.wte", "transformer.h.0", "transformer.h.0.attn",
                                          "transformer.h.0.mlp"]]
        meta = json.loads(f.attrs["similarity"])
        meta["rows"] = meta["cols"] = [FIRED[i] for i in order]
        f.attrs["similarity"] = json.dumps(meta)
        d = f["captures/similarity/__model__/linear_cka"]
        d[...] = d[()][np.ix_(order, order)]
    with hookrun.open_run(path) as run:
        da = run.similarity()
        assert list(da.coords["at"].values) == meta["rows"]
        np.testing.assert_allclose(da.sel(at="transformer.h.0", with_at="transformer.h.0.mlp").item(),
                                   cka(k[3], l_[2]), rtol=1e-6)
