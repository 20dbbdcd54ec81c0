"""Capture dims named by meaning (issue 21): the `dims` attribute read with h5py, to_xarray's dims
and coordinates against numpy over the raw datasets, GPT-2 eager's attention patterns against
transformers' output_attentions, and the attention plot's labels read back from matplotlib."""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download

import h5py
import numpy as np
import pytest
import torch
from conftest import batches, make_cfg
from toy_lm import tiny_gpt2

import hookrun
from hookrun import open_run
from hookrun.errors import ConfigError, RunError

transformers = pytest.importorskip("transformers")
xr = pytest.importorskip("xarray")

HEADS, T, N = 4, 12, 6
PATTERN = ["sample", "head", "query", "key"]
SITES = {
    "p": {"at": "transformer.h.*.attn/softmax", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
    "w": {"at": "transformer.h.0.attn", "type": "forward", "actions": [{"name": "record", "what": "output.1"}]},
    "mm": {"at": "transformer.h.0.attn/matmul", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
    "resid": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
    "tok": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]},
}


def gpt2_folder(tmp_path):
    """A GPT-2 with eager attention over byte tokens, saved where model=hf reads it (model.path)."""
    model = tiny_gpt2(0, "eager", n_head=HEADS, n_embd=32, n_positions=32, vocab_size=259,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(tmp_path / "gpt2"))
    return model, str(tmp_path / "gpt2")


LINES = ["the cat sat", "a dog", "hi there you", "ok", "one two", "birds fly far"]  # 6 samples of unequal length


def gpt2_cfg(tmp_path, folder, hooks, name="c.h5"):
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(LINES) + "\n")
    return {"model": {"_target_": "hookrun.models.hf", "model_class": "GPT2LMHeadModel", "path": folder,
                      "attn_implementation": "eager"},
            "data": {"dataset": {"_target_": "hookrun.data.text", "files": [str(lines)], "tokenizer": "byte", "max_length": T, "limit": N,
                                 "padding": "longest", "padding_side": "right"},
                     "batch_size": 3, "store": ["input_ids", "attention_mask"]},
            "device": "cpu", "progress": False, "hooks": hooks, "output": {"path": str(tmp_path / name)}}


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt2")
    model, folder = gpt2_folder(tmp)
    path = hookrun.run(gpt2_cfg(tmp, folder, SITES)).path
    return model, path


def test_attention_patterns_of_gpt2_eager_are_sample_head_query_key(gpt2_run):
    model, path = gpt2_run
    with h5py.File(path) as f:
        ids, mask = f["samples/input_ids"][:], f["samples/attention_mask"][:]
        assert mask.min() == 0  # padded samples are part of the batch
        with torch.no_grad():
            want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_attentions=True).attentions
        for layer in range(2):
            ds = f[f"captures/p/transformer.h.{layer}.attn%2Fsoftmax.0/output"]
            assert list(ds.attrs["dims"]) == PATTERN
            np.testing.assert_allclose(ds[:], want[layer].numpy(), rtol=1e-5, atol=1e-6)
        weights = f["captures/w/transformer.h.0.attn/output.1"]  # the attention module's own weights output
        assert list(weights.attrs["dims"]) == PATTERN
        np.testing.assert_allclose(weights[:], want[0].numpy(), rtol=1e-5, atol=1e-6)
        # the two matmuls of one attention forward: q @ k^T (the scores) and pattern @ v (per-head values)
        scores = f["captures/mm/transformer.h.0.attn%2Fmatmul.0/output"]
        assert list(scores.attrs["dims"]) == PATTERN
        assert list(f["captures/mm/transformer.h.0.attn%2Fmatmul.1/output"].attrs["dims"]) == ["sample", "head", "token", "feature"]
        t = ids.shape[1]
        allowed = np.tril(np.ones((t, t), bool))[None] & (mask[:, None, :] == 1)  # causal, padding left out
        z = np.where(allowed[:, None], scores[:] / np.sqrt(32 // HEADS), -np.inf)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        real = mask == 1  # the real queries' rows (a padded query's row is of no interest)
        np.testing.assert_allclose(p.transpose(0, 2, 1, 3)[real], want[0].numpy().transpose(0, 2, 1, 3)[real], rtol=1e-4, atol=1e-6)
        assert list(f["captures/resid/transformer.h.1/output"].attrs["dims"]) == ["sample", "token", "feature"]
        assert list(f["captures/tok/transformer.h.0/output"].attrs["dims"]) == ["token", "feature"]
        index = f["samples/index"][:]
    with open_run(path) as run:
        ds = run.to_xarray(["p/transformer.h.0.attn/softmax.0/output", "p/transformer.h.1.attn/softmax.0/output"])
    for layer in range(2):
        da = ds[f"p/transformer.h.{layer}.attn/softmax.0/output"]
        assert da.dims == tuple(PATTERN)  # every layer shares the same four axes
        np.testing.assert_allclose(da.values, want[layer].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ds["sample"].values, index)
    assert dict(ds.sizes) == {"sample": N, "head": HEADS, "query": ids.shape[1], "key": ids.shape[1]}


def test_token_rows_carry_each_rows_sample_and_position(gpt2_run):
    _, path = gpt2_run
    with h5py.File(path) as f:
        mask, index = f["samples/attention_mask"][:], f["samples/index"][:]
        raw_tok, raw_resid = f["captures/tok/transformer.h.0/output"][:], f["captures/resid/transformer.h.1/output"][:]
    rows, cols = np.nonzero(mask)  # numpy's own map of the real tokens: (row, position) in order
    want_sample, want_position = index[rows], cols  # right padding: position = column
    with open_run(path) as run:
        alone = run.to_xarray(["tok/transformer.h.0/output"])
        mixed = run.to_xarray(["tok/transformer.h.0/output", "resid/transformer.h.1/output"])
    tok = alone["tok/transformer.h.0/output"]
    assert tok.dims == ("token", "feature")
    np.testing.assert_array_equal(tok["sample"].values, want_sample)
    np.testing.assert_array_equal(tok["position"].values, want_position)
    np.testing.assert_array_equal(tok.values, raw_tok)
    # beside a capture with a `sample` axis the token coordinates take the file's names
    tok, resid = mixed["tok/transformer.h.0/output"], mixed["resid/transformer.h.1/output"]
    np.testing.assert_array_equal(tok["token_sample"].values, want_sample)
    np.testing.assert_array_equal(tok["token_position"].values, want_position)
    assert resid.dims == ("sample", "resid/transformer.h.1/output:token", "feature")  # its T is not the token rows' M
    np.testing.assert_array_equal(resid["sample"].values, index)
    np.testing.assert_array_equal(resid.values, raw_resid)
    # a token row equals the sample-major row of the same sample and position (h.0 feeds h.1: compare h.0 with itself)
    sel = tok.where((tok["token_sample"] == index[2]) & (tok["token_position"] == 1), drop=True)
    np.testing.assert_array_equal(sel.values[0], raw_tok[(want_sample == index[2]) & (want_position == 1)][0])


def test_image_maps_features_reductions_and_steps(tmp_path, checkpoint, reference_model, dataset):
    hooks = {"blocks": {"at": "layer1.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "deep": {"at": "layer2.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "pooled": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", "reduce": "mean"}]},
             "rowmax": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", "reduce": "max", "dims": "width",
                                                                        "select": {"dim": "channel", "index": [0, 3]}}]},
             "whole": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "step"}]}}
    path = hookrun.run(make_cfg(tmp_path, checkpoint, hooks)).path
    with h5py.File(path) as f:
        dims = {k: list(f[f"captures/{k}"].attrs["dims"]) for k in
                ("blocks/layer1.0/output", "logits/fc/output", "pooled/layer2/output", "rowmax/layer2/output", "whole/fc/output")}
        fmap, deep = f["captures/blocks/layer1.0/output"][:], f["captures/deep/layer2.0/output"][:]
    assert dims == {"blocks/layer1.0/output": ["sample", "channel", "height", "width"],
                    "logits/fc/output": ["sample", "feature"],
                    "pooled/layer2/output": ["sample", "channel"],
                    "rowmax/layer2/output": ["sample", "channel", "height"],
                    "whole/fc/output": ["step", "dim_1", "dim_2"]}
    with open_run(path) as run:
        ds = run.to_xarray(["blocks/layer1.0/output", "deep/layer2.0/output", "logits/fc/output"])
    a, b = ds["blocks/layer1.0/output"], ds["deep/layer2.0/output"]
    # 64 channels against 128: the names they disagree on are qualified, the samples stay shared
    assert a.dims == ("sample",) + tuple(f"blocks/layer1.0/output:{d}" for d in ("channel", "height", "width"))
    assert b.dims == ("sample",) + tuple(f"deep/layer2.0/output:{d}" for d in ("channel", "height", "width"))
    assert ds["logits/fc/output"].dims == ("sample", "feature")
    np.testing.assert_array_equal(a.values, fmap)
    np.testing.assert_array_equal(b.values, deep)
    with torch.no_grad():
        logits = torch.cat([reference_model(x) for x, _ in batches(dataset)]).numpy()
    np.testing.assert_allclose(ds["logits/fc/output"].values, logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("action", "named"), [
    ({"reduce": "mean", "dims": "token"}, "dim 'token' is axis 1 of output, which is its 'channel' axis here (its axes "
                                          "after the sample: channel, height, width)"),
    ({"select": {"dim": "token", "index": [0]}}, "dim 'token' is axis 1 of output, which is its 'channel' axis"),
    ({"reduce": "max", "dims": "feature"}, "dim 'feature' is axis 3 of output, which is its 'width' axis"),
])
def test_a_dim_named_for_an_axis_the_tensor_lacks_is_refused(tmp_path, checkpoint, action, named):
    """`dims: token` on a feature map reduced its channels (token was axis 1 whatever the tensor)."""
    hooks = {"x": {"at": "layer1.0", "type": "forward", "actions": [{"name": "record", "what": "output", **action}]}}
    with pytest.raises(RunError, match=re.escape(f"hook 'x' at layer1.0: {named}")):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks))


def test_dim_names_override_and_their_count_is_checked(tmp_path):
    _, folder = gpt2_folder(tmp_path)
    named = {"p": {"at": "transformer.h.0.attn/softmax", "type": "forward",
                   "actions": [{"name": "record", "what": "output", "dim_names": ["h", "q", "k"]}]}}
    path = hookrun.run(gpt2_cfg(tmp_path, folder, named)).path
    with h5py.File(path) as f:
        assert list(f["captures/p/transformer.h.0.attn%2Fsoftmax.0/output"].attrs["dims"]) == ["sample", "h", "q", "k"]
    wrong = {"p": {**named["p"], "actions": [{"name": "record", "what": "output", "dim_names": ["q", "k"]}]}}
    with pytest.raises(RunError, match=r"record dim_names has 2 name\(s\), but output of transformer.h.0.attn/softmax.0 is "
                                       r"stored as one row of shape \(4, \d+, \d+\) per sample: give 3 name\(s\)"):
        hookrun.run(gpt2_cfg(tmp_path, folder, wrong, "wrong.h5"))
    for bad in (["h", "h", "k"], "h q k", ["a/b", "q", "k"]):
        spec = {"p": {**named["p"], "actions": [{"name": "record", "what": "output", "dim_names": bad}]}}
        with pytest.raises(ConfigError, match=r"record dim_names="):
            hookrun.run(gpt2_cfg(tmp_path, folder, spec, "bad.h5"))
    assert not (tmp_path / "bad.h5").exists()


def test_a_file_without_the_attribute_reads_with_derived_names(gpt2_run, tmp_path):
    _, path = gpt2_run
    old = tmp_path / "old.h5"
    old.write_bytes(path.read_bytes())
    with h5py.File(old, "r+") as f:  # as a file written before `dims` existed
        f["captures"].visititems(lambda name, obj: obj.attrs.__delitem__("dims") if "dims" in obj.attrs else None)
    with open_run(old) as run:
        got = {c.label: c.dims for c in run.captures}
        ds = run.to_xarray(["p/transformer.h.1.attn/softmax.0/output", "resid/transformer.h.1/output"])
    assert got["p/transformer.h.1.attn/softmax.0/output"] == tuple(PATTERN)  # the op site's name says softmax
    assert got["resid/transformer.h.1/output"] == ("sample", "token", "feature")
    assert got["tok/transformer.h.0/output"] == ("token", "feature")
    assert ds["resid/transformer.h.1/output"].dims == ("sample", "token", "feature")


def test_attention_plot_labels_heads_query_key_and_token_text(gpt2_run, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from hookrun.cli import figures
    from hookrun.cli import plot_command as plot

    _, path = gpt2_run
    with h5py.File(path) as f:
        ids, mask = f["samples/input_ids"][:2], f["samples/attention_mask"][:2]
    # the tokens' text written out here: byte b is id b + 3, 1 is <bos>, a space shows as '␣'
    text = [["<bos>" if t == 1 else chr(t - 3).replace(" ", "\u2423") for t in row[m == 1]] for row, m in zip(ids, mask, strict=True)]
    seen = {}
    draw = figures.attention_grid

    def spy(*args, **kwargs):
        seen["fig"] = fig = draw(*args, **kwargs)
        return fig

    with open_run(path) as run:
        info = run.find("p", "transformer.h.1.attn/softmax.0", "output")
        monkeypatch.setattr(plot, "histogram", lambda run, info, out, left=None, taken=None: out / "hist")  # (not what this test is about)
        others = plot.plot_run(run, tmp_path / "all", samples=1)
        monkeypatch.setattr(figures, "attention_grid", spy)
        written = plot.attention_maps(run, info, tmp_path / "all", samples=2)
    fig = seen["fig"]
    maps = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(maps) == 2 * HEADS
    assert [ax.get_title() for ax in maps[:HEADS]] == [f"#0 · head {h}" for h in range(HEADS)]
    assert all(ax.get_xlabel() == "key" and ax.get_ylabel() == "query" for ax in maps)
    for s, ax in ((0, maps[0]), (1, maps[HEADS])):
        n = int(mask[s].sum())
        assert ax.images[0].get_array().shape == (n, n)  # cropped to the sample's real tokens
        assert [t.get_text() for t in ax.get_xticklabels()] == text[s]
        assert [t.get_text() for t in ax.get_yticklabels()] == text[s]
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]  # one a sample: its heads share a scale
    assert len(bars) == 2 and all("one scale per sample" in ax.get_ylabel() for ax in bars)
    assert written.name == "attn_p__transformer.h.1.attn__softmax.0__output.png" and written.stat().st_size > 5000
    names = {p.name for p in others}
    assert "attn_w__transformer.h.0.attn__output.1.png" in names
    assert not any(n.startswith("fmap_") for n in names)  # an attention pattern is not a feature map


def test_a_resumed_run_keeps_the_names_its_first_part_wrote(tmp_path):
    from toy_models import STOP_AT

    from hookrun.output.process import Interrupted

    _, folder = gpt2_folder(tmp_path)
    hooks = {"p": {"at": "transformer.h.0.attn/softmax", "type": "forward",
                   "actions": [{"name": "record", "what": "output", "dim_names": ["h", "q", "k"]}]},
             "stop": {"at": "transformer.h.0", "type": "forward", "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}}
    cfg = gpt2_cfg(tmp_path, folder, hooks, "part.h5")
    STOP_AT[:] = [0]  # (in the last batch a signal cuts nothing short: the run ends complete)
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    hookrun.run({**cfg, "resume": True})  # the replayed batches are written first, with the old file's names
    with h5py.File(tmp_path / "part.h5") as f:
        assert f.attrs["status"] == "complete"
        ds = f["captures/p/transformer.h.0.attn%2Fsoftmax.0/output"]
        assert ds.shape[0] == N and list(ds.attrs["dims"]) == ["sample", "h", "q", "k"]


def test_each_call_of_an_op_site_keeps_its_own_names_and_limit(gpt2_run, tmp_path):
    """One record action serves every call of `MODULE/FN`: what it keeps per capture is kept per call."""
    _, path = gpt2_run
    folder = str(path.parent / "gpt2")
    hooks = {"mm": {"at": "transformer.h.0.attn/matmul", "type": "forward", "actions": [{"name": "record", "what": "output", "limit": 4}]}}
    with h5py.File(hookrun.run(gpt2_cfg(tmp_path, folder, hooks)).path) as f, h5py.File(path) as full:
        for k, dims in ((0, PATTERN), (1, ["sample", "head", "token", "feature"])):
            name = f"captures/mm/transformer.h.0.attn%2Fmatmul.{k}/output"
            assert list(f[name].attrs["dims"]) == dims
            np.testing.assert_array_equal(f[name][:], full[name][:4])  # the first 4 samples, as the unlimited run has them
