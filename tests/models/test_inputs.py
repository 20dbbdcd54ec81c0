"""Batches of any shape: dict and tuple items, data.inputs / data.target, collate, live objects.
Every recorded value is compared with the model called by hand on the same items."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from kw_models import NoneTargets, Ragged, Scorer, Tokens, TokenTuples

import hookrun
from hookrun.errors import ConfigError, RunError
from hookrun.runner.calls import to_device

LOGITS = {"logits": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def base(tmp_path, **data) -> dict:
    return {"data": {"batch_size": 4, **data}, "device": "cpu", "progress": False, "hooks": LOGITS,
            "output": {"path": str(tmp_path / "c.h5")}}


def reference(model, ds, **call) -> np.ndarray:
    with torch.no_grad():
        return torch.cat([model(**{k: torch.stack([ds[i][v] for i in range(len(ds))]) for k, v in call.items()})]).numpy()


def test_dict_items_run_as_model_star_star_batch_minus_the_label(tmp_path):
    torch.manual_seed(0)
    model, ds = Scorer().eval(), Tokens(n=10)
    hookrun.run(base(tmp_path), model=model, dataset=ds)  # batches of 4, 4, 2: a smaller last batch
    with h5py.File(tmp_path / "c.h5") as f:
        got = f["captures/logits/head/output"][:]
        np.testing.assert_array_equal(f["samples/target"][:], ds.labels.numpy())
        assert "model:\n  live: kw_models.Scorer" in f.attrs["config"]
    want = reference(model, ds, input_ids="input_ids", attention_mask="attention_mask")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_tuple_items_with_inputs_mapping_and_target_position(tmp_path):
    torch.manual_seed(0)
    model, ds = Scorer().eval(), TokenTuples(n=9)
    hookrun.run(base(tmp_path, inputs={"input_ids": 0, "attention_mask": 1}, target=2), model=model, dataset=ds)
    with h5py.File(tmp_path / "c.h5") as f:
        got = f["captures/logits/head/output"][:]
        np.testing.assert_array_equal(f["samples/target"][:], ds.labels.numpy())
    want = reference(model, ds, input_ids=0, attention_mask=1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # positional inputs: model(item[0], item[1])
    hookrun.run(base(tmp_path, inputs=[0, 1], target=None, store=[]) | {"output": {"path": str(tmp_path / "d.h5")}},
                model=model, dataset=ds)
    with h5py.File(tmp_path / "d.h5") as f:
        np.testing.assert_allclose(f["captures/logits/head/output"][:], want, rtol=1e-6, atol=1e-6)
        assert "target" not in f["samples"]


def test_data_store_keeps_batch_keys_per_sample(tmp_path):
    model, ds = Scorer().eval(), Tokens(n=6)
    hookrun.run(base(tmp_path, store=["input_ids", "attention_mask"], batch_size=4), model=model, dataset=ds)
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["samples/input_ids"][:], ds.ids.numpy())
        np.testing.assert_array_equal(f["samples/attention_mask"][:], ds.mask.numpy())


@pytest.mark.parametrize("items, store, message", [
    ("dicts", ["input_ids", "nope"], "data.store: the batch has no tensor 'nope'; its keys: input_ids, attention_mask, label"),
    ("tuples", ["input_ids"], "data.store=['input_ids'] names keys of dict items, but a batch is a list (tuple or tensor "
                              "items have no keys); remove data.store (data.store=[])"),
])
def test_a_data_store_key_the_items_lack_is_refused_before_the_file_opens(tmp_path, items, store, message):
    """It was a RunError after the first batch's forward, leaving a 'failed' file with 0 batches where a
    bad config writes nothing (docs/config.md)."""
    ds = Tokens(n=6) if items == "dicts" else TokenTuples(n=6)
    data = {"store": store} if items == "dicts" else {"store": store, "inputs": {"input_ids": 0, "attention_mask": 1}, "target": 2}
    with pytest.raises(ConfigError) as err:
        hookrun.run(base(tmp_path, **data), model=Scorer(), dataset=ds)
    assert str(err.value) == message and not (tmp_path / "c.h5").exists()


@pytest.mark.parametrize("data, message", [
    ({"inputs": ["nope"]}, "data.inputs: the items have no key 'nope'; their keys: input_ids, attention_mask, label"),
    ({"target": "y"}, "data.target: the items have no key 'y'"),
    ({"inputs": "input_ids"}, "data.inputs: expected a list of keys or positions"),
])
def test_bad_inputs_are_refused_with_the_keys(tmp_path, data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        hookrun.run(base(tmp_path, **data), model=Scorer(), dataset=Tokens())


def test_tuple_positions_out_of_range(tmp_path):
    with pytest.raises(ConfigError, match=r"data.target: position 5 does not exist; the items are tuples of 3 \(0 to 2\)"):
        hookrun.run(base(tmp_path, target=5), model=Scorer(), dataset=TokenTuples())


@pytest.mark.parametrize("workers", [0, 1])
def test_items_of_different_sizes_give_one_line(tmp_path, workers):
    with pytest.raises(RunError, match=r"^data: the samples \[0, 1, 2, 3\] cannot be stacked into one batch .*shapes \(3,\), \(4,\)") as info:
        hookrun.run(base(tmp_path, num_workers=workers) | {"hooks": None}, model=torch.nn.Identity(), dataset=Ragged())
    assert "\n" not in str(info.value)


def test_none_targets_give_one_line(tmp_path):
    # issue 23: a None target is a config matter (exit 2) naming data.dataset and data.target
    with pytest.raises(ConfigError, match=r"data\.target: the items' target \(1\) is None.*data\.dataset.*data\.target=null"):
        hookrun.run(base(tmp_path) | {"hooks": None}, model=torch.nn.Identity(), dataset=NoneTargets())


def test_collate_lists_passes_lists_to_the_model(tmp_path):
    seen = []

    class Lengths(torch.nn.Module):
        def forward(self, xs: list) -> torch.Tensor:
            seen.append([len(x) for x in xs])
            return torch.stack([x.sum() for x in xs])

    collate = {"_target_": "hookrun.data.collate_lists", "_partial_": True}
    hookrun.run(base(tmp_path, collate=collate, batch_size=3) | {"hooks": None}, model=Lengths(), dataset=Ragged())
    assert seen == [[3, 4, 5], [6]]


def test_collate_lists_of_images_with_class_labels_give_a_target_tensor(tmp_path):
    """Images of different sizes with an int class each, through collate_lists: the target reached the loss
    as a list (a TypeError traceback in cross_entropy) and /samples/target was never written. Reference:
    torch.autograd.grad of torch's cross-entropy on the labels stacked by hand, the model called by hand."""
    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(3, 4)

        def forward(self, xs: list) -> torch.Tensor:
            return self.head(torch.stack([x.mean((1, 2)) for x in xs]))

    torch.manual_seed(0)
    model = Pooled()
    items = [(torch.randn(3, 4 + i, 5), i % 4 if i % 2 else np.int64(i % 4)) for i in range(5)]  # (numpy labels too)
    collate = {"_target_": "hookrun.data.collate_lists", "_partial_": True}
    hooks = {"g": {"at": "head", "type": "tensor", "actions": [{"name": "record"}]}}
    hookrun.run(base(tmp_path, collate=collate, batch_size=3) | {"hooks": hooks, "mode": "grad", "loss": {
        "_target_": "torch.nn.CrossEntropyLoss"}}, model=model, dataset=items)
    want = []
    for lo in (0, 3):
        logits = model([x for x, _ in items[lo:lo + 3]])
        labels = torch.tensor([int(y) for _, y in items[lo:lo + 3]])
        want.append(torch.autograd.grad(torch.nn.functional.cross_entropy(logits, labels), logits)[0])
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["samples/target"][:], [int(y) for _, y in items])
        np.testing.assert_allclose(f["captures/g/head/grad"][:], torch.cat(want).numpy(), rtol=1e-5, atol=1e-7)


class Labelled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x, labels=None):
        return self.head(x)


def test_a_loss_given_no_target_is_one_line_naming_data_target(tmp_path):
    """Dict items with `labels` (transformers' name; data.target=auto takes `target` or `label`) and
    loss=torch.nn.CrossEntropyLoss: cross_entropy's TypeError traceback. Named, the target works:
    the recorded d loss / d logits against torch.autograd.grad of torch's cross-entropy."""
    torch.manual_seed(0)
    model, items = Labelled(), [{"x": torch.randn(4), "labels": i % 3} for i in range(6)]
    cfg = base(tmp_path, batch_size=3) | {"mode": "grad", "loss": {"_target_": "torch.nn.CrossEntropyLoss"},
                                          "hooks": {"g": {"at": "head", "type": "tensor"}}}
    with pytest.raises(RunError) as err:
        hookrun.run(cfg, model=model, dataset=items)
    assert str(err.value) == (
        "loss: the batch has no target (data.target=auto takes item[1] of a tuple, or a dict item's `target` or `label` "
        "key; name yours, e.g. data.target=labels), and CrossEntropyLoss(output, None) raised TypeError: "
        "cross_entropy_loss(): argument 'target' (position 2) must be Tensor, not NoneType "
        "(the traceback: HYDRA_FULL_ERROR=1 or --verbose)")
    halve = {"h": {"at": "head", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}}
    with pytest.raises(RunError) as evaluated:  # evaluate's loss: the same line
        hookrun.run(cfg | {"mode": "eval", "hooks": halve, "evaluate": {}, "output": {"path": str(tmp_path / "e.h5")}},
                    model=model, dataset=items)
    assert str(evaluated.value) == str(err.value)
    hookrun.run(cfg | {"data": {"batch_size": 3, "target": "labels"}, "output": {"path": str(tmp_path / "d.h5")}},
                model=model, dataset=items)
    x, y = torch.stack([i["x"] for i in items]), torch.tensor([i["labels"] for i in items])
    want = [torch.autograd.grad(torch.nn.functional.cross_entropy(o, t), o)[0]
            for o, t in ((model(x[lo:lo + 3]), y[lo:lo + 3]) for lo in (0, 3))]
    with h5py.File(tmp_path / "d.h5") as f:
        np.testing.assert_allclose(f["captures/g/head/grad"][:], torch.cat(want).numpy(), rtol=1e-5, atol=1e-7)


def test_a_collate_function_without_partial_says_to_add_it(tmp_path):
    """Hydra called collate_lists() with no items: 'missing 1 required positional argument', with no word of
    the `_partial_: true` that data.collate needs."""
    with pytest.raises(ConfigError) as err:
        hookrun.run(base(tmp_path, collate={"_target_": "hookrun.data.collate_lists"}), model=Scorer(), dataset=Tokens())
    assert str(err.value) == ("data.collate: building 'hookrun.data.collate_lists' failed: TypeError: collate_lists() missing 1 "
                              "required positional argument: 'items'; a collate function is called with the list of items: "
                              "add `_partial_: true` to data.collate")


def test_live_model_must_be_a_module(tmp_path):
    with pytest.raises(ConfigError, match="run\\(model=...\\): got a str, not a torch.nn.Module"):
        hookrun.run(base(tmp_path), model="gpt2", dataset=Tokens())


def test_to_device_moves_nested_tensors():
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), {"c": torch.ones(1)}], "d": "text"}
    moved = to_device(batch, torch.device("meta"))
    assert moved["a"].is_meta and moved["b"][0].is_meta and moved["b"][1]["c"].is_meta and moved["d"] == "text"


def test_a_capture_with_an_empty_dim_is_stored(tmp_path):
    class NoBoxes(torch.nn.Module):
        def forward(self, x):
            return x.new_zeros(0, 4)

    hooks = {"none": {"at": "", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    hookrun.run(base(tmp_path) | {"hooks": hooks}, model=NoBoxes(), dataset=[torch.ones(2)] * 6)
    with h5py.File(tmp_path / "c.h5") as f:
        assert f["captures/none/__model__/output"].shape == (2, 0, 4)


def test_structured_outputs_reach_the_losses(tmp_path):
    """A dict output with logits: cross_entropy uses them; the gradient equals autograd's."""
    torch.manual_seed(0)
    model, ds = Scorer().eval(), Tokens(n=8)
    forward = model.forward
    model.forward = lambda **kw: {"logits": forward(**kw), "extra": None}
    hooks = {"g": {"at": "head", "type": "tensor", "actions": ["record"]}}
    loss = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    hookrun.run(base(tmp_path) | {"hooks": hooks, "mode": "grad", "loss": loss}, model=model, dataset=ds)
    want = []
    for i in range(0, 8, 4):
        keep = []
        h = model.head.register_forward_hook(lambda m, a, o, keep=keep: keep.append(o))
        out = forward(input_ids=ds.ids[i:i + 4], attention_mask=ds.mask[i:i + 4])
        h.remove()
        want.append(torch.autograd.grad(torch.nn.functional.cross_entropy(out, ds.labels[i:i + 4]), keep[0])[0])
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_allclose(f["captures/g/head/grad"][:], torch.cat(want).numpy(), rtol=1e-5, atol=1e-8)


def test_tuple_items_give_the_mask_passed_as_attention_mask_to_token_rows(tmp_path):
    torch.manual_seed(0)
    model, ds = Scorer().eval(), TokenTuples(n=6)
    hooks = {"emb": {"at": "embed", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    hookrun.run(base(tmp_path, inputs={"input_ids": 0, "attention_mask": 1}, target=2) | {"hooks": hooks}, model=model, dataset=ds)
    with h5py.File(tmp_path / "c.h5") as f:
        keep = ds.mask.bool()
        np.testing.assert_array_equal(f["captures/emb/embed/output"][:], model.embed(ds.ids)[keep].detach().numpy())
        np.testing.assert_array_equal(f["samples/token_position"][:], keep.nonzero()[:, 1].numpy())


def test_token_positions_count_real_tokens_under_left_padding(tmp_path):
    """Left-padded items: a token's position is its place among the sample's real tokens (as in
    generate mode), not its padded column; the rows are the raw embedding's rows under the mask."""
    torch.manual_seed(0)
    model, ds = Scorer().eval(), Tokens(n=6)
    ds.ids, ds.mask = ds.ids.flip(1), ds.mask.flip(1)  # the same sequences, padded on the left
    hooks = {"emb": {"at": "embed", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    hookrun.run(base(tmp_path) | {"hooks": hooks}, model=model, dataset=ds)
    keep = ds.mask.bool()
    want_position = np.concatenate([np.arange(int(n)) for n in keep.sum(1)])
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["captures/emb/embed/output"][:], model.embed(ds.ids)[keep].detach().numpy())
        np.testing.assert_array_equal(f["samples/token_sample"][:], keep.nonzero()[:, 0].numpy())
        np.testing.assert_array_equal(f["samples/token_position"][:], want_position)
        assert (keep.nonzero()[:, 1].numpy() != want_position).any()  # the padded column would differ


class ScaledInPlace(torch.nn.Module):
    """Token ids (with or without a mask), and the hooked embedding's output scaled in place after the hook."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(input_ids)
        h.mul_(0)  # what the hook saw must not follow
        return self.head(h).mean(dim=1)


@pytest.mark.parametrize("mask", [False, True], ids=["no mask", "a mask of ones"])
def test_token_rows_where_every_token_is_real_are_every_token_in_order_and_a_copy(tmp_path, mask):
    """No attention mask, or one of all ones: every (sample, position) is a row, in order, equal to
    the embedding called directly; the rows are copied at the hook, so the forward's later in-place
    op does not reach them."""
    torch.manual_seed(0)
    model, ids = ScaledInPlace().eval(), torch.randint(0, 20, (6, 5))
    hooks = {"emb": {"at": "embed", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    if mask:
        items = [{"input_ids": i, "attention_mask": torch.ones_like(i)} for i in ids]
        hookrun.run(base(tmp_path) | {"hooks": hooks}, model=model, dataset=items)
    else:
        hookrun.run(base(tmp_path) | {"hooks": hooks}, model=model, dataset=torch.utils.data.TensorDataset(ids))
    with torch.no_grad():
        want = model.embed(ids).reshape(-1, 8).numpy()
    assert np.abs(want).sum() > 0
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["captures/emb/embed/output"][:], want)
        np.testing.assert_array_equal(f["samples/token_sample"][:], np.repeat(np.arange(6), 5))
        np.testing.assert_array_equal(f["samples/token_position"][:], np.tile(np.arange(5), 6))


def test_flattened_batch_times_tokens_rows_follow_the_mask():
    """A (B*T, d) tensor (flattened before an MLP) gives the same token rows as (B, T, d), by a
    hand-flattened mask."""
    from hookrun.hooks.tokens import TokenMap, step_token_rows

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    tokens = TokenMap.of_batch(mask)
    t = torch.arange(24.0).view(6, 4)
    rows = tokens.take(t, 2, "output", "here")
    np.testing.assert_array_equal(rows.numpy(), t[mask.reshape(-1).bool()].numpy())
    token_map = step_token_rows([tokens], torch.tensor([5, 6]), with_generated=False).columns
    np.testing.assert_array_equal(token_map[0], [5, 5, 6])
    np.testing.assert_array_equal(token_map[1], [0, 1, 0])
