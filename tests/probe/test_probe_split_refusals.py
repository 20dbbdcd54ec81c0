"""A split that leaves no training item is one line before any batch, refused exactly where
scikit-learn's train_test_split refuses it (its rounding: ceil(test * n) test items), data.limit's items
counted; an error inside probe.test_data's dataset node names that node's key, not data.dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toy_models import Id

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("sklearn")
from sklearn.model_selection import train_test_split  # noqa: E402


def items(n=120):
    g = np.random.default_rng(0)
    x = g.normal(size=(n, 6)).astype(np.float32)
    return [{"x": torch.tensor(x[i]), "value": torch.tensor(float(x[i, 0]))} for i in range(n)]


def sklearn_refuses(n, test):
    try:
        train, _ = train_test_split(np.arange(n), test_size=test, random_state=0)
    except ValueError:
        return True
    return len(train) == 0


@pytest.mark.parametrize("test, limit", [(0.999, None), (0.9917, None), (0.99, None), (0.97, 2), (0.96, 2)])
def test_a_split_with_no_training_item_is_refused_before_any_batch(tmp_path, test, limit):
    n = 120 if limit is None else limit * 16  # (data.limit batches of 16)
    model, forwards = Id().eval(), []
    model.register_forward_hook(lambda *a: forwards.append(1))
    cfg = {"device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "data": {"batch_size": 16, "limit": limit, "inputs": ["x"]},
           "probe": {"at": "lin", "target": "value", "method": "ridge", "control": False, "split": {"test": test}}}
    if not sklearn_refuses(n, test):
        hookrun.run(cfg, model=model, dataset=items())
        assert hookrun.open_run(tmp_path / "p.h5").probes()[0]["rows"] == n
        return
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=model, dataset=items())
    assert str(err.value).startswith(f"probe.split.test={test}: the split holds out ceil({test} x {n}) = {n} of "
                                     f"the run's {n} items") and "\n" not in str(err.value)
    assert not forwards and not (tmp_path / "p.h5").exists()


def test_one_item_is_refused_without_advising_a_split_that_is_refused_too(tmp_path):
    """With one item no split.test works (sklearn refuses every one): the line said `give probe.split.test at
    most 0.0`, a value the block itself refuses; it now says that a split needs 2 items, or test_data."""
    cfg = {"device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "data": {"batch_size": 16, "inputs": ["x"]},
           "probe": {"at": "lin", "target": "value", "method": "ridge", "control": False}}
    assert sklearn_refuses(1, 0.25) and sklearn_refuses(1, 0.01)
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=Id().eval(), dataset=items(1))
    assert str(err.value) == ("probe.split.test=0.25: the run has 1 item, and a split needs at least 2 (one to train "
                              "on, one to test); probe more items, or give probe.test_data")
    assert not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("key, value, message", [
    ("size", 0, "probe.test_data.dataset.size: expected a whole number >= 1, got 0"),
    ("noise", -1.0, "probe.test_data.dataset.noise: expected a standard deviation >= 0, got -1.0")])
def test_an_error_in_the_test_data_node_names_its_key(tmp_path, key, value, message):
    data = {"_target_": "hookrun.data.shapes", "size": 32}
    cfg = {"model": {"_target_": "hookrun.models.tiny_cnn"}, "data": {"dataset": data, "batch_size": 8},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "test_data": {"dataset": {**data, key: value}}}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg)
    assert str(err.value) == message


@pytest.mark.parametrize("probe, message", [
    ({"split": {"test": 0.5}, "test_data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 16}}},
     "probe.split.test=0.5 beside probe.test_data: the test rows are test_data's items and no split is made; drop "
     "split.test (split.seed still seeds the control task)"),
    ({"split": {"seed": True}}, "probe.split.seed=True is not a whole number; give an integer")])
def test_a_split_that_would_be_ignored_or_a_bool_seed_is_one_line_before_the_model(tmp_path, probe, message):
    """split.test beside test_data was silently unused (test_data is the test set): refused in one line
    before anything is built, as a bool seed is."""
    cfg = {"model": {"_target_": "hookrun.models.tiny_cnn"}, "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 32},
                                                                     "batch_size": 8},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", **probe}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg)
    assert str(err.value) == message and not (tmp_path / "p.h5").exists()
