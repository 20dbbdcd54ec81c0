"""docs/format.md said a probe file's group /probe/NNN is the hook point's place in `at`; the writer
numbers them in the model's order of its modules (the `points` attribute, docs/probe.md), so a
reader of the file alone, given `at: [transformer.h.1, transformer.wte]`, took /probe/000 for h.1.
Checked against the model called directly: each group's weight and bias, applied to the raw
activations of the module its number names in `points`, score exactly the accuracy the group
reports over all its rows."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import hookrun

pytest.importorskip("transformers")


def test_probe_groups_follow_points_in_model_order(tmp_path):
    at = ["transformer.h.1", "transformer.wte"]
    cfg = hookrun.compose("experiment=probe_tokens", "data.dataset.limit=32", "data.batch_size=16", "progress=false",
                          f"probe.at=[{','.join(at)}]", f"output.path={tmp_path / 'p.h5'}")
    path = hookrun.run(cfg).path
    from hookrun.models import tiny_lm
    from hookrun.runner.kinds.probe.targets import SPACE

    model = tiny_lm().eval()
    with h5py.File(path, "r") as f:
        points = json.loads(f["probe"].attrs["points"])
        assert points == ["transformer.wte", "transformer.h.1"] and sorted(f["probe"]) == ["000", "001"]
        ids, mask = torch.tensor(f["samples/input_ids"][:]), torch.tensor(f["samples/attention_mask"][:]).bool()
        acts = {}
        for name in points:
            model.get_submodule(name).register_forward_hook(
                lambda mod, i, o, name=name: acts.__setitem__(name, o[0] if isinstance(o, tuple) else o))
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask.long())
        prev = torch.full_like(ids, -1)
        prev[:, 1:] = ids[:, :-1]
        y = (prev == SPACE)[mask].numpy()
        for k, name in enumerate(points):
            g = f[f"probe/{k:03d}"]
            assert g.attrs["module"] == name
            x = acts[name][mask].double().numpy()
            accuracy = ((x @ g["weight"][:].T + g["bias"][:])[:, 0] > 0) == y
            a = g.attrs
            assert accuracy.size == a["rows"]
            reported = (a["train_score"] * a["train_rows"] + a["test_score"] * a["test_rows"]) / a["rows"]
            np.testing.assert_allclose(accuracy.mean(), reported, atol=1e-12)


def test_a_block_and_the_modules_inside_it_are_in_the_order_their_outputs_come(tmp_path):
    """named_modules lists transformer.h.0 before its attn and mlp, whose outputs come before the block's: the
    depth picture drew the block's output (after its MLP) at a shallower depth than its attention. Reference:
    the order raw forward hooks on the same modules fire in one forward of the model called directly."""
    at = ["transformer.h.0", "transformer.h.0.mlp", "transformer.wte", "transformer.h.0.attn", "transformer.ln_f"]
    cfg = hookrun.compose("experiment=probe_tokens", "data.dataset.limit=16", "data.batch_size=16", "progress=false",
                          "probe.control=false", f"probe.at=[{','.join(at)}]", f"output.path={tmp_path / 'p.h5'}")
    path = hookrun.run(cfg).path
    from hookrun.models import tiny_lm

    model, fired = tiny_lm().eval(), []
    for name in at:
        model.get_submodule(name).register_forward_hook(lambda mod, i, o, name=name: fired.append(name))
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 50, 51]]))
    assert fired == ["transformer.wte", "transformer.h.0.attn", "transformer.h.0.mlp", "transformer.h.0", "transformer.ln_f"]
    with h5py.File(path, "r") as f:
        assert json.loads(f["probe"].attrs["points"]) == fired
        assert [f[f"probe/{k:03d}"].attrs["module"] for k in range(len(at))] == fired
    with hookrun.open_run(path) as run:
        assert run.probes().column("at") == fired
