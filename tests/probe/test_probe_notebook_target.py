"""hookrun.probe given its targets as an array (or a function object) says in one line, before any
forward, what to give in a notebook: the targets inside the items and their key; it said 'probe.target:
a ndarray object cannot be in a config ...; name what builds it: {_target_: package.module.Name, ...}'.
The form it names equals scikit-learn's Ridge on the features a raw forward hook records; so does that of
items that hold no target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("sklearn")
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from test_probe_kind import N, Net, data, recorded  # noqa: E402


@pytest.mark.parametrize("given", ["array", "tensor", "function"])
def test_targets_given_as_an_object_are_one_line_and_the_form_it_names_is_sklearns(given):
    model, ds = Net().eval(), data()
    y = np.array([float(d["value"]) for d in ds])
    target = {"array": y, "tensor": torch.from_numpy(y), "function": lambda batch: batch["value"]}[given]
    seen = []
    h = model.register_forward_hook(lambda *a: seen.append(1))
    with pytest.raises(ConfigError, match=r"^probe: target= is an item key \('label'\) or \{'_target_': 'my_pkg.labels'\}"):
        hookrun.probe(model, [{"x": d["x"]} for d in ds], inputs=["x"], at="conv", target=target, method="ridge")
    h.remove()
    assert not seen

    items = [{"x": d["x"], "label": float(t)} for d, t in zip(ds, y, strict=True)]  # the form the line names
    table = hookrun.probe(model, items, batch_size=16, inputs=["x"], at="conv", target="label", method="ridge",
                          standardize=False, control=False)
    feats = recorded(model, ds, model.conv).mean((2, 3))
    tr, te = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    w, b = table.weights["conv"]
    np.testing.assert_allclose(feats[te] @ w[0] + b[0], Ridge(alpha=1.0).fit(feats[tr], y[tr]).predict(feats[te]), rtol=1e-6)


def test_items_without_a_target_say_how_to_give_one_and_that_form_is_sklearns():
    """Items that are the model's input alone said "probe.target='label': the items are Tensors with no
    such key; use `label` (the data's target) or a position", naming the key it was given as the fix."""
    model, ds = Net().eval(), data()
    with pytest.raises(ConfigError, match=r"^probe.target='label': the items are Tensors that hold no target beside the "
                                          r"model's input; give each item its target: \(x, y\) tuples, or dicts with a "
                                          r"'label' key$"):
        hookrun.probe(model, [d["x"] for d in ds], at="conv")
    y = np.array([float(d["value"]) for d in ds])
    table = hookrun.probe(model, [(d["x"], d["value"]) for d in ds], batch_size=16, at="conv", method="ridge",
                          standardize=False, control=False)
    feats = recorded(model, ds, model.conv).mean((2, 3))
    tr, te = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    w, b = table.weights["conv"]
    np.testing.assert_allclose(feats[te] @ w[0] + b[0], Ridge(alpha=1.0).fit(feats[tr], y[tr]).predict(feats[te]), rtol=1e-6)
