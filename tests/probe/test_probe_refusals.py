"""The refusals issue 48 lists that had no test at their edges: split.test at 0 and 1 (outside
(0, 1)), and many ranks with no channel between them for probe and similarity (resume=true or not:
many ranks resume, tests/probe/test_probe_rank_resume.py): each one ConfigError line before any batch;
and the warning for test rows whose class no training row has."""

from __future__ import annotations

import pytest
import torch

import hookrun
from hookrun.errors import ConfigError, HookrunError

DATA = {"dataset": {"_target_": "hookrun.data.shapes", "size": 16}, "batch_size": 8}
MODEL = {"_target_": "hookrun.models.tiny_cnn"}


@pytest.mark.parametrize("test", [0.0, 1.0, -0.25])
def test_split_test_outside_0_1_is_one_line(tmp_path, test) -> None:
    cfg = {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "split": {"test": test}}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg)
    assert f"probe.split.test={test}" in str(err.value) and "(0, 1)" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("size", ["abc", -1, 0, 2.5, True])
def test_a_test_data_batch_size_that_is_no_size_is_one_line(tmp_path, size) -> None:
    """('abc' was a traceback, -1 named data.batch_size, 0 fell back to data.batch_size and 2.5 ran as 2)"""
    cfg = {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "test_data": {"dataset": DATA["dataset"], "batch_size": size}}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg)
    assert str(err.value) == (f"probe.test_data.batch_size={size!r}: a whole number of 1 or more (or leave it out: "
                              f"data.batch_size)") and not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("method", ["logistic", "ridge"])
def test_features_that_are_not_finite_are_one_line_naming_the_module(tmp_path, method) -> None:
    """A NaN in the pooled rows ended a logistic run `complete` with NaN weights (reported "not
    converged"), and a ridge run in scipy's traceback."""
    from hookrun.data import shapes

    items = list(shapes(16))
    x, y = items[11]
    items[11] = (x.clone().fill_(float("nan")), y)  # item 11: every block's rows NaN
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "method": method}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg, model=hookrun.models.tiny_cnn(), dataset=items)
    assert str(err.value) == ("probe.at: block1's pooled output holds NaN or infinite values in 1 row(s) of this batch "
                              "(the first of item 11); a probe needs finite features: probe another module, or find where "
                              "the model overflows (its dtype, its inputs)")
    with hookrun.open_run(tmp_path / "p.h5") as run:
        assert run.status == "failed"


@pytest.mark.parametrize(("key", "message"), [
    ("batchsize", "probe.test_data.batchsize: not a key of the test data node, whose keys are dataset and batch_size; "
                  "did you mean probe.test_data.batch_size?"),
    ("limit", "probe.test_data.limit: not a key of the test data node, whose keys are dataset and batch_size (every "
              "test item is used; give fewer items in the dataset node)"),
])
def test_a_key_the_test_data_node_has_not_is_one_line(tmp_path, key, message) -> None:
    """(a misspelt batch_size and a limit were ignored in silence: every test item used)"""
    cfg = {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "test_data": {"dataset": DATA["dataset"], key: 1}}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg)
    assert str(err.value) == message and not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize(("block", "message"), [
    ({"probe": {"at": ["block1"], "target": "label"}}, "probe over 2 ranks: no channel between the ranks"),
    ({"similarity": {"at": ["block1", "fc"]}}, "similarity over 2 ranks: no channel between the ranks"),
])
def test_many_ranks_without_a_channel_are_one_line(tmp_path, block, message) -> None:
    from hookrun.config import load
    from hookrun.output.process import Ranks
    from hookrun.output.shards import ShardRun
    from hookrun.runner.prepare import prepare

    cfg = load({"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "resume": True,
                "output": {"path": str(tmp_path / "p.h5")}, **block})
    p = prepare(cfg)
    try:
        ShardRun(cfg, Ranks(rank=1, world=2)).adjust(p)  # (no rendezvous: no channel)
        with pytest.raises(ConfigError) as err:
            p.settings.kind.prepare_run(p)
        assert message in str(err.value) and "\n" not in str(err.value)
    finally:
        p.env.close()
        p.settings.kind.close()


class Twice(torch.nn.Module):
    """One linear layer applied twice in a forward (a shared module, as a weight-tied or looped block)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lin(self.lin(x)))


def test_a_module_that_runs_twice_in_a_forward_is_one_line_before_any_batch(tmp_path) -> None:
    """The probe took the first call's output and said nothing (similarity refuses it): one line now."""
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, generator=g), i % 2) for i in range(16)]
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["lin"], "target": "label"}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=Twice(), dataset=data)
    assert str(err.value) == ("probe.at: lin ran twice in one forward (a shared module): which call's output "
                              "to take is not defined; name a module that runs once per forward")
    assert not (tmp_path / "p.h5").exists()
    hookrun.run({**cfg, "probe": {"at": ["head"], "target": "label"}}, model=Twice(), dataset=data)  # once: fine


class Router(torch.nn.Module):
    """A mixture-of-experts' gate over the batch's tokens flattened: `gate` gives (batch x tokens, experts)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.gate = torch.nn.Embedding(20, 5), torch.nn.Linear(5, 3)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids)
        return h * self.gate(h.reshape(-1, 5)).softmax(-1).reshape(*h.shape[:2], 3)[..., :1]


@pytest.mark.parametrize("pool", ["mean", "every"])
def test_an_output_whose_first_axis_is_not_the_batch_is_one_line_before_any_batch(tmp_path, pool) -> None:
    """A (batch x tokens, experts) output took its 48 rows for 48 items of a batch of 8: an IndexError traceback
    at the first batch (pool every: a line calling the rows one per item). One line naming both, no file;
    the module after it, (batch, tokens, 5), is probed."""
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(1, 20, (6,), generator=g), "label": i % 2} for i in range(16)]
    cfg = {"data": {"batch_size": 8, "inputs": {"input_ids": "input_ids"}}, "device": "cpu", "progress": False,
           "output": {"path": str(tmp_path / "p.h5")}, "probe": {"at": ["gate"], "target": "label", "pool": pool}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=Router(), dataset=data)
    assert str(err.value).startswith("probe.at: gate's output (48, 3) has 48 rows on its first axis for a batch of 8 "
                                     "items: not batch first")
    assert "\n" not in str(err.value) and not (tmp_path / "p.h5").exists()
    hookrun.run({**cfg, "probe": {"at": ["emb"], "target": "label", "pool": pool}}, model=Router(), dataset=data)


class Positions(torch.nn.Module):
    """GPT-2's learned positions: `pos` gives (1, tokens, 5), one table the batch shares (added by broadcasting)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.pos = torch.nn.Embedding(20, 5), torch.nn.Embedding(6, 5)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.emb(input_ids) + self.pos(torch.arange(input_ids.shape[1])[None])


def test_an_output_the_batch_shares_is_one_line_before_any_batch(tmp_path) -> None:
    """(1, tokens, 5) was read as one item's token rows per batch: the first item's targets on the table's rows,
    and a split of the few items that gave rows (a line at the end of the pass about no training rows, or a
    probe of the position table). One line naming both, no file."""
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(1, 20, (6,), generator=g), "label": i % 2} for i in range(32)]
    cfg = {"data": {"batch_size": 8, "inputs": {"input_ids": "input_ids"}}, "device": "cpu", "progress": False,
           "output": {"path": str(tmp_path / "p.h5")}, "probe": {"at": ["pos"], "target": "label", "pool": "mean"}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=Positions(), dataset=data)
    assert str(err.value).startswith("probe.at: pos's output (1, 6, 5) has 1 rows on its first axis for a batch of 8 "
                                     "items: not batch first (an output shared by the batch")
    assert "\n" not in str(err.value) and not (tmp_path / "p.h5").exists()


def test_test_rows_of_a_class_no_training_row_has_are_said_once(tmp_path, caplog) -> None:
    """A class that only test items have (a fine-grained label over few items: the default synthetic
    data's 1000 classes) makes those rows wrong at every hook point, which the table alone reads as a
    layer that knows nothing: one warning with their count (sklearn's split on the same items)."""
    import logging

    import numpy as np
    from sklearn.model_selection import train_test_split

    g = torch.Generator().manual_seed(3)
    labels = [i % 10 for i in range(20)]  # 10 classes over 20 items: the split leaves some only in the test
    data = [(torch.randn(4, generator=g), labels[i]) for i in range(20)]
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
    tr, te = train_test_split(np.arange(20), test_size=0.25, random_state=0)
    unseen = int(sum(labels[i] not in {labels[j] for j in tr} for i in te))
    assert unseen > 0  # (the case happens on these items: the test can fail)
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["0", "1"], "target": "label"}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        hookrun.run(cfg, model=model, dataset=data)
    said = [r.getMessage() for r in caplog.records if "no training row has" in r.getMessage()]
    assert said == [f"probe: {unseen} of {len(te)} test rows have a class no training row has (all items: 10 classes over 20 "
                    f"rows): no probe can name it, so those rows are wrong whatever the layer; give more items per "
                    f"class, or a coarser target"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hookrun"):  # every class in the training rows: nothing said
        hookrun.run({**cfg, "output": {"path": str(tmp_path / "q.h5")}}, model=model,
                    dataset=[(x, i % 2) for i, (x, _) in enumerate(data)])
    assert not [r for r in caplog.records if "no training row has" in r.getMessage()]


def _rows(batch) -> int:
    return len(next(iter(batch.values())) if isinstance(batch, dict) else batch[0])


def three_targets(batch) -> torch.Tensor:
    """Three targets whatever the batch (a user's function of the wrong length)."""
    return torch.zeros(3, dtype=torch.long)


def nan_targets(batch) -> torch.Tensor:
    t = torch.arange(_rows(batch), dtype=torch.float32)
    t[1] = float("nan")
    return t


@pytest.mark.parametrize(("fn", "method", "message"), [
    ("three_targets", "logistic", r"gives \(3,\) for a batch of 8 items; a probe needs one target per item or per token: \(8,\)"),
    ("nan_targets", "ridge", r"holds 1 NaN or infinite target\(s\) in this batch at block1; every probe row needs a finite"),
])
def test_a_target_function_of_the_wrong_length_or_with_nan_is_one_line_at_the_first_batch(tmp_path, fn, method, message):
    """The first crashed in row_targets with an IndexError; the second ran the whole pass and then
    scipy's "array must not contain infs or NaNs"."""
    cfg = {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": {"_target_": f"test_probe_refusals.{fn}"}, "method": method,
                     "control": False}}
    with pytest.raises(ConfigError, match=message) as err:
        hookrun.run(cfg)
    assert "\n" not in str(err.value)


def text_targets(batch) -> torch.Tensor:
    """A text batch's targets (a dict's `input_ids`), given the shapes' (image, label) lists."""
    return batch["input_ids"][:, 0]


def test_a_target_function_that_raises_is_one_line_naming_it(tmp_path) -> None:
    """hookrun's own `is_space` (or any function written for text) on an image data set raised TypeError from
    inside the run, a traceback; now one line naming the function, as a loss that raises is, and no probe."""
    cfg = {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": {"_target_": "test_probe_refusals.text_targets"}, "control": False}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg)
    line = str(err.value)
    assert "\n" not in line and line.startswith("probe.target: test_probe_refusals.text_targets(batch) raised TypeError: "
                                                "list indices must be integers or slices, not str"), line
    assert not (tmp_path / "p.h5").exists() or hookrun.open_run(tmp_path / "p.h5").status != "complete"


@pytest.mark.parametrize("alpha", [float("inf"), float("nan"), -1.0])
def test_a_ridge_penalty_that_is_not_a_finite_number_of_0_or_more_is_one_line_before_any_batch(tmp_path, alpha) -> None:
    """(alpha=inf ran the whole pass, then ended in scipy's 'array must not contain infs or NaNs' traceback,
    the file marked failed; sklearn's Ridge refuses it)"""
    cfg = {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "method": "ridge", "alpha": alpha}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg)
    assert str(err.value) == (f"probe.alpha={alpha}: ridge's penalty must be a finite number, 0 or more (e.g. 1.0), "
                              f"as sklearn's Ridge takes it")
    assert not (tmp_path / "p.h5").exists()


def _flat_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.Flatten())  # width: 2 x H x W


def test_test_data_of_another_row_width_is_one_line_before_any_batch(tmp_path) -> None:
    """(test items of 16 x 16 beside training items of 32 x 32 at a Flatten ran the pass, then ended in
    torch.cat's 'Sizes of tensors must match' traceback at the fit)"""
    from hookrun.data import shapes

    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["1"], "target": "label",
                     "test_data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 8, "image_size": 16}}}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=_flat_model(), dataset=shapes(16))
    assert str(err.value) == ("probe.test_data: 1 gives rows of 512 features for the test items and 2048 for the first "
                              "batch (its output's width follows the input's shape); give test items of the training "
                              "items' shape, or probe a module of one width (a feature map, pooled)")
    assert not (tmp_path / "p.h5").exists()


def test_a_batch_of_another_row_width_is_one_line_at_that_batch(tmp_path) -> None:
    from hookrun.data import shapes

    items = list(shapes(8)) + list(shapes(8, image_size=16))
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["1"], "target": "label"}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg, model=_flat_model(), dataset=items)
    assert str(err.value) == ("probe.at: 1 gives rows of 512 features for this batch and 2048 for the first batch (its "
                              "output's width follows the input's shape); give items of one shape, or probe a module of "
                              "one width (a feature map, pooled)")
    with hookrun.open_run(tmp_path / "p.h5") as run:
        assert run.status == "failed"


@pytest.mark.parametrize("method", ["ridge", "logistic"])
def test_test_data_targets_of_another_kind_are_one_line_before_any_batch(method) -> None:
    """(float test targets beside integer training classes: a ridge probe became a regression, R^2 0.10 / -0.12
    written as its scores with no majority class; a logistic one ran the pass and was refused after it)"""
    from torch.utils.data import TensorDataset

    torch.manual_seed(0)
    x, xt = torch.randn(40, 1, 6, 6), torch.randn(12, 1, 6, 6)
    train, test = TensorDataset(x, torch.arange(40) % 3), TensorDataset(xt, (torch.arange(12) % 3).float())
    with pytest.raises(ConfigError) as err:
        hookrun.probe(_flat_model(), train, at=["1"], batch_size=10, method=method, control=False, test_data=test)
    assert str(err.value) == ("probe.test_data: the test items give float (value) targets and the first batch integer "
                              "(class) targets; give integer classes throughout, or floats for a regression")


def test_a_batch_of_targets_of_another_kind_is_one_line_at_that_batch(tmp_path) -> None:
    from hookrun.data import shapes

    items = list(shapes(16))
    items[12] = (items[12][0], 1.5)  # (the second batch's targets collate to floats)
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["1"], "target": "label", "method": "ridge"}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg, model=_flat_model(), dataset=items)
    assert str(err.value) == ("probe.target: this batch gives float (value) targets and the first batch integer (class) "
                              "targets; give integer classes throughout, or floats for a regression")
    with hookrun.open_run(tmp_path / "p.h5") as run:
        assert run.status == "failed"
