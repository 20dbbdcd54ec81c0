"""Reductions on record, early stop: values against numpy / PyTorch on the same data."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch
from conftest import batches, make_cfg, run_cli

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


@pytest.mark.parametrize("first, second", [({"limit": 6}, {}), ({}, {"every": 2}), ({"what": None, "limit": 4}, {})])
def test_two_records_of_one_tensor_with_other_limits_in_one_hook_are_refused(tmp_path, checkpoint, first, second):
    """Two records of one tensor in one hook are numbered by the order they fire (output, output@1): once
    the limited one stopped, the other's rows took its name (measured: output 10 rows, attrs limit 6; output@1 8 of 12)."""
    actions = [{"name": "record", "what": "output", **first}, {"name": "record", "what": "output", **second}]
    hooks = {"r": {"at": "layer2", "type": "forward", "actions": actions}}
    with pytest.raises(ConfigError, match=r"hooks\.r\.actions\.1: a second record of output in hook 'r' with "
                                          r"another every/limit \(every: \d+, limit: \w+; here every: \d+, limit: \w+\); "
                                          r".*; give one of them a hook of its own"):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks))
    assert not list(tmp_path.rglob("*.h5"))


def test_the_same_records_in_two_hooks_keep_their_own_rows(run_hooks, reference_model, dataset):
    """The refusal's way out: the limited record in a hook of its own, each equal to layer2 called directly."""
    f = run_hooks({"a": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", "limit": 6}]},
                   "b": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    want = layer2_out(reference_model, dataset)
    np.testing.assert_allclose(f["captures/a/layer2/output"][:], want[:6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f["captures/b/layer2/output"][:], want, rtol=1e-5, atol=1e-6)


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
    ({"dims": [9]}, r"record dims=\[9\] does nothing without reduce; add reduce \(choose from: max, mean, norm\), or remove dims"),
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


class SeqModel(torch.nn.Module):
    """(B, T, 16) in and out; inside, a TransformerEncoderLayer and an LSTM, sequence-first unless `first`."""

    def __init__(self, first: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = first
        self.enc = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=first)
        self.lstm = torch.nn.LSTM(16, 8, batch_first=first)

    def forward(self, x):
        h = x if self.first else x.transpose(0, 1)
        out, _ = self.lstm(self.enc(h))
        return out if self.first else out.transpose(0, 1)


def seq_run(tmp_path, model, hooks, n=12, t=8, batch=4, name="seq.h5"):
    """The run's file and, per hook, what a raw forward hook on the same module saw in each batch."""
    data = [(x, 0) for x in torch.randn(n, t, 16, generator=torch.Generator().manual_seed(1))]
    seen = {h: [] for h in hooks}
    parts = {h: [int(i) for i in spec["actions"][0]["what"].split(".")[1:]] for h, spec in hooks.items()}  # output.1.0: o[1][0]

    def keep(h, o):
        for i in parts[h]:
            o = o[i]
        seen[h].append(o)

    handles = [model.get_submodule(spec["at"]).register_forward_hook(lambda m, a, o, h=h: keep(h, o))
               for h, spec in hooks.items()]
    with torch.no_grad():
        for start in range(0, n, batch):
            model(torch.stack([x for x, _ in data[start:start + batch]]))
    for handle in handles:
        handle.remove()
    cfg = {"hooks": hooks, "device": "cpu", "progress": False, "data": {"batch_size": batch},
           "output": {"path": str(tmp_path / name)}}
    return hookrun.run(cfg, model=model.eval(), dataset=data).path, seen


def rec_at(at, what="output", **params):
    return {"at": at, "type": "forward", "actions": [{"name": "record", "what": what, **params}]}


@pytest.mark.parametrize("t", [8, 4], ids=["T!=B", "T==B"])
def test_sequence_first_tensors_are_stored_per_step_never_as_samples(tmp_path, caplog, t):
    """batch_first=False (PyTorch's default): (T, B, E) was folded to rows 'per sample' that held every sample's
    tokens (T=8, B=4), or read as (sample, token, feature) with T == B; now one row per step, as raw hooks saw it."""
    hooks = {"e": rec_at("enc"), "lin": rec_at("enc.linear1"), "l": rec_at("lstm", "output.0"),
             "h": rec_at("lstm", "output.1.0")}  # the LSTM's h_n: (layers, B, H) whatever batch_first
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path, seen = seq_run(tmp_path, SeqModel(first=False).eval(), hooks, t=t)
    with h5py.File(path) as f:
        for h, role in (("e", "enc/output"), ("lin", "enc.linear1/output"), ("l", "lstm/output.0"), ("h", "lstm/output.1.0")):
            ds = f[f"captures/{h}/{role}"]
            assert ds.attrs["rows"] == "steps" and ds.attrs["dims"][0] == "step" and ds.shape[:3] == (3, t if h != "h" else 1, 4)
            np.testing.assert_allclose(ds[:], torch.stack(seen[h]).numpy(), rtol=1e-5, atol=1e-6)
    # said once for each tensor whose shape looked like rows of samples (h_n's (1, 4, 8) did not)
    assert caplog.text.count("its batch is at axis 1") == 3 and "batch_first=False" in caplog.text


def test_batch_first_modules_keep_rows_of_samples(tmp_path):
    hooks = {"e": rec_at("enc"), "l": rec_at("lstm", "output.0")}
    path, seen = seq_run(tmp_path, SeqModel(first=True).eval(), hooks, t=4)
    with h5py.File(path) as f:
        for h, role in (("e", "enc/output"), ("l", "lstm/output.0")):
            ds = f[f"captures/{h}/{role}"]
            assert ds.attrs["rows"] == "samples" and ds.shape[:2] == (12, 4)
            np.testing.assert_allclose(ds[:], torch.cat(seen[h]).numpy(), rtol=1e-5, atol=1e-6)


def test_rows_sample_of_a_sequence_first_tensor_or_a_short_last_batch_is_refused_at_the_first_batch(tmp_path, caplog):
    model = SeqModel(first=False).eval()
    with pytest.raises(RunError, match=r"rows=sample, but output of enc has shape \(4, 4, 16\) in a batch of 4: its batch is "
                                       r"at axis 1 \(the module runs sequence-first, batch_first=False\), not first; use rows: step"):
        seq_run(tmp_path, model, {"e": rec_at("enc", rows="sample")}, t=4)
    with pytest.raises(RunError, match=r"one row per step cannot hold it either: the last batch of these 10 samples has 2; "
                                       r"give a data.batch_size that divides 10"):
        seq_run(tmp_path, model, {"e": rec_at("enc")}, n=10, name="short.h5")
    with caplog.at_level(logging.WARNING, logger="hookrun"):  # rows: step says so: no warning
        path, seen = seq_run(tmp_path, model, {"e": rec_at("enc", rows="step")}, name="step.h5")
    assert "axis 1" not in caplog.text
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/e/enc/output"][:], torch.stack(seen["e"]).numpy(), rtol=1e-5, atol=1e-6)


class Transposed(torch.nn.Module):
    """A module of no batch_first that hands on (T, B, E): its shape (T = 2B) is what tells."""

    def __init__(self) -> None:
        super().__init__()
        self.swap = torch.nn.Identity()

    def forward(self, x):
        return self.swap(x.transpose(0, 1).contiguous()).transpose(0, 1)


def test_an_undeclared_t_by_b_tensor_is_per_step_and_rows_sample_folds_it_as_asked(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path, seen = seq_run(tmp_path, Transposed(), {"s": rec_at("swap")})
    assert "rows: sample folds it per sample if its axis 0 is batch-major" in caplog.text
    path2, _ = seq_run(tmp_path, Transposed(), {"s": rec_at("swap", rows="sample")}, name="fold.h5")
    with h5py.File(path) as f, h5py.File(path2) as g:
        want = torch.stack(seen["s"])  # (steps, T, B, E)
        assert f["captures/s/swap/output"].attrs["rows"] == "steps"
        np.testing.assert_array_equal(f["captures/s/swap/output"][:], want.numpy())
        np.testing.assert_array_equal(g["captures/s/swap/output"][:], want.reshape(12, 2, 4, 16).numpy())


def test_a_select_past_an_axis_is_refused_before_any_batch_and_in_a_dry_run(tmp_path):
    """index 9 of a conv's 4 channels was refused only inside batch 0 (a 'failed' file left behind), and only
    the dry run's estimate refused it before: now the checks' one-sample forward refuses both, one line."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU())
    batch_sizes = []
    model[0].register_forward_hook(lambda m, args, out: batch_sizes.append(args[0].shape[0]))
    data = [(torch.randn(1, 8, 8), 0) for _ in range(6)]
    hooks = {"r": {"at": "0", "type": "forward",
                   "actions": [{"name": "record", "what": "output", "select": {"dim": "channel", "index": [1, 9]}}]}}
    for dry_run in (False, True):
        with pytest.raises(ConfigError) as exc:
            hookrun.run({"hooks": hooks, "device": "cpu", "progress": False, "dry_run": dry_run, "data": {"batch_size": 3},
                         "output": {"path": str(tmp_path / "a.h5")}}, model=model, dataset=data)
        assert str(exc.value) == ("hooks.r.actions.0: select index 9 of dim channel at 0 is past the 4 entries of output "
                                  "(shape (1, 4, 6, 6) in one sample's forward); use 0 to 3 (or -4 to -1)")
    assert batch_sizes == [1, 1] and not list(tmp_path.iterdir())  # one sample's forward each, no batch of 3


@pytest.mark.slow
def test_a_token_index_past_the_texts_is_refused_before_any_batch_on_the_command_line(tmp_path):
    done = run_cli("model=tiny_lm", "data=text", "progress=false", f"hydra.run.dir={tmp_path}",
                   "hooks={r: {at: transformer.h.0, type: forward, actions: [{name: record, what: output, "
                   "select: {dim: token, index: [999]}}]}}")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        "hookrun: error: hooks.r.actions.0: select index 999 of dim token at transformer.h.0 is past the 32 entries "
        "of output (shape (1, 32, 128) in one sample's forward); use 0 to 31 (or -32 to -1)"), done.stderr
    assert not (tmp_path / "captures.h5").exists()
