"""Reductions on record, early stop: values against numpy / PyTorch on the same data."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from conftest import batches, make_cfg

import hookrun
from hookrun.errors import ConfigError, RunError


def layer2_out(model, dataset) -> np.ndarray:
    m = model
    with torch.no_grad():
        return torch.cat([m.layer2(m.layer1(m.maxpool(m.relu(m.bn1(m.conv1(x)))))) for x, _ in batches(dataset)]).numpy()


def rec(**params):
    return {"r": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", **params}]}}


@pytest.mark.parametrize("params, reference", [
    ({"reduce": "mean"}, lambda a: a.mean(axis=(2, 3))),
    ({"reduce": "max", "dims": "channel"}, lambda a: a.max(axis=1)),
    ({"reduce": "norm", "dims": [2, 3]}, lambda a: np.sqrt((a.astype(np.float64) ** 2).sum(axis=(2, 3)))),
    ({"select": {"dim": "channel", "index": [3, 0, 7]}}, lambda a: a[:, [3, 0, 7]]),
    ({"select": {"dim": 1, "index": "0:64:8"}}, lambda a: a[:, 0:64:8]),
    ({"select": [{"dim": "height", "index": [0]}, {"dim": "width", "index": "1:3"}]}, lambda a: a[:, :, [0], 1:3]),
    ({"select": {"dim": "channel", "index": "0:16"}, "reduce": "mean"}, lambda a: a[:, :16].mean(axis=(2, 3))),
], ids=["mean-spatial", "max-channel", "norm", "select-list", "select-slice", "select-two", "select-then-reduce"])
def test_reductions_match_numpy(run_hooks, reference_model, dataset, params, reference):
    f = run_hooks(rec(**params))
    got = f["captures/r/layer2/output"][:]
    np.testing.assert_allclose(got, reference(layer2_out(reference_model, dataset)), rtol=1e-5, atol=1e-5)


def test_reduced_capture_says_what_was_done(run_hooks):
    f = run_hooks(rec(reduce="mean", select={"dim": "channel", "index": "0:16"}, dtype="float16", every=2, limit=5))
    attrs = dict(f["captures/r/layer2/output"].attrs)
    assert attrs["reduce"] == "mean" and attrs["reduce_dims"] == "spatial"
    assert attrs["select"] == "dim channel: 0:16" and attrs["every"] == 2 and attrs["limit"] == 5
    assert attrs["record_dtype"] == "float16" and f["captures/r/layer2/output"].dtype == np.float16


def test_bfloat16_is_rounded_then_stored_as_float32(run_hooks, reference_model, dataset):
    f = run_hooks(rec(dtype="bfloat16"))
    ds = f["captures/r/layer2/output"]
    want = torch.from_numpy(layer2_out(reference_model, dataset)).to(torch.bfloat16).float().numpy()
    assert ds.dtype == np.float32
    np.testing.assert_array_equal(ds[:], want)


def test_every_keeps_every_nth_step_with_its_sample_index(run_hooks, reference_model, dataset):
    f = run_hooks(rec(every=2))  # 3 steps of 4: steps 0 and 2
    ds = f["captures/r/layer2/output"]
    index = f["captures/r/layer2/output.index"][:]
    np.testing.assert_array_equal(index, [0, 1, 2, 3, 8, 9, 10, 11])
    np.testing.assert_allclose(ds[:], layer2_out(reference_model, dataset)[index], rtol=1e-5, atol=1e-6)


def test_limit_keeps_the_first_rows(run_hooks, reference_model, dataset):
    f = run_hooks(rec(limit=6))
    ds = f["captures/r/layer2/output"]
    assert ds.shape[0] == 6
    np.testing.assert_array_equal(f["captures/r/layer2/output.index"][:], np.arange(6))
    np.testing.assert_allclose(ds[:], layer2_out(reference_model, dataset)[:6], rtol=1e-5, atol=1e-6)
    assert f["samples/index"].shape[0] == 12  # the run itself saw every sample


def test_limit_counts_steps_for_per_step_captures(run_hooks):
    grad = {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}}
    f = run_hooks({"w": {"at": "fc.bias", "type": "param", "actions": [{"name": "record", "limit": 2}]}}, **grad)
    assert f["captures/w/fc.bias/grad"].shape == (2, 10)


def test_check_finite_stops_the_run(tmp_path, checkpoint):
    hooks = {"bad": {"at": "layer2", "type": "forward", "actions": [
        {"name": "modify_output", "op": {"_target_": "toy_models.make_inf", "_partial_": True}},
        {"name": "record", "check_finite": True}]}}
    with pytest.raises(RunError, match=r"hook 'bad' at layer2: output has 1 non-finite value\(s\) at step 0"):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks))


@pytest.mark.parametrize("params, message", [
    ({"reduce": "median"}, "record reduce='median'; choose from: max, mean, norm"),
    ({"reduce": "mean", "dims": "depth"}, "dim 'depth'; use a number, 'spatial' or one of"),
    ({"reduce": "mean", "dims": 0}, "dim 0 is the batch"),
    ({"select": {"dim": 1, "index": "a:b"}}, "is not a slice like"),
    ({"select": [1, 2]}, "select expects"),
    ({"every": 0}, "every=0"),
    ({"dtype": "int8"}, "record dtype='int8'"),
])
def test_bad_reduction_params(tmp_path, checkpoint, params, message):
    with pytest.raises(ConfigError, match=message):
        hookrun.run(make_cfg(tmp_path, checkpoint, rec(**params)))


def test_dim_that_does_not_exist_is_named(tmp_path, checkpoint):
    hooks = {"r": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output", "reduce": "mean"}]}}
    with pytest.raises(RunError, match="output has 2 dims, no spatial dims to reduce"):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks))


def test_early_stop_gives_the_same_captures_and_skips_the_rest(tmp_path, checkpoint):
    from toy_models import CountingNet

    def go(early_stop, name):
        cfg = make_cfg(tmp_path, checkpoint, {"b": {"at": "body", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
                       early_stop=early_stop, **{"output.path": str(tmp_path / name)})
        cfg["model"] = {"_target_": "toy_models.CountingNet"}
        cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
        CountingNet.head_calls = 0
        with h5py.File(hookrun.run(cfg).path) as f:
            return f["captures/b/body/output"][:], CountingNet.head_calls

    full, head_full = go(False, "full.h5")
    early, head_early = go(True, "early.h5")
    np.testing.assert_array_equal(full, early)
    assert head_full == 3 and head_early == 1  # only the first batch runs the whole forward


@pytest.mark.parametrize("over, hooks, message", [
    ({"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.sum_output", "_partial_": True}}, rec(), "early_stop=true needs mode=eval"),
    ({}, {"m": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "zero"}]}}, "needs hooks that only record"),
])
def test_early_stop_refuses_what_it_cannot_stop(tmp_path, checkpoint, over, hooks, message):
    with pytest.raises(ConfigError, match=message):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks, early_stop=True, **over))


def test_an_integer_capture_is_stored_as_it_came_and_says_no_record_dtype(tmp_path):
    """dtype=float16 leaves integers as they are (embedding ids); the capture said record_dtype=float16."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 4), torch.nn.Flatten(), torch.nn.Linear(12, 2))
    data = [(torch.randint(0, 11, (3,)), 0) for _ in range(5)]
    hooks = {"ids": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "input", "dtype": "float16"}]},
             "emb": {"at": "1", "type": "forward", "actions": [{"name": "record", "what": "input", "dtype": "float16"}]}}
    cfg = {"hooks": hooks, "device": "cpu", "progress": False, "data": {"batch_size": 2},
           "output": {"path": str(tmp_path / "ids.h5")}}
    with h5py.File(hookrun.run(cfg, model=model, dataset=data).path) as f:
        ids, emb = f["captures/ids/0/input"], f["captures/emb/1/input"]
        np.testing.assert_array_equal(ids[:], torch.stack([x for x, _ in data]).numpy())
        assert ids.dtype == np.int64 and "record_dtype" not in ids.attrs
        assert emb.dtype == np.float16 and emb.attrs["record_dtype"] == "float16"


def test_select_past_the_dim_or_taking_nothing_is_one_line_and_negative_indices_count_from_the_end(run_hooks, reference_model, dataset):
    """index [70] of 64 channels came out as torch's "INDICES element is out of DATA bounds"; '70:80' stored
    an empty capture; [-1, 0] failed in index_select."""
    with pytest.raises(ConfigError, match=r"select index 500 of dim channel at layer2 is past the 128 entries .* use 0 to 127"):
        run_hooks(rec(select={"dim": "channel", "index": [70, 500]}))
    with pytest.raises(ConfigError, match=r"select channel=200:300 at layer2 takes nothing of the 128 entries"):
        run_hooks(rec(select={"dim": "channel", "index": "200:300"}), **{"output.overwrite": True})
    f = run_hooks(rec(select={"dim": "channel", "index": [-1, 0]}), **{"output.overwrite": True})
    np.testing.assert_allclose(f["captures/r/layer2/output"][:], layer2_out(reference_model, dataset)[:, [-1, 0]], rtol=1e-5, atol=1e-5)
