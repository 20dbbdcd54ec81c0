"""A class count below 2 is one ConfigError line: before any batch where the data set lists its
targets up front (torchvision's `targets`), else at the end of the pass before any solver, with no
probe written and the file not complete; the CLI exits non-zero with that line. The reference is the
data's own targets (numpy's unique)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from rank_runs import ENV, cli
from torch import nn

import hookrun
from hookrun.errors import ConfigError
from hookrun.runner.kinds.probe.fit import split_items

N, B = 24, 8


class Listed(torch.utils.data.Dataset):
    """Images whose targets the data set lists up front (as torchvision's `targets`)."""

    def __init__(self, n: int = N, classes: int = 1) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 4, 4, generator=g)
        self.targets = [i % classes for i in range(n)]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.targets[i]


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)).eval()


def cfg(path, **block) -> dict:
    return {"data": {"batch_size": B}, "device": "cpu", "progress": False, "output": {"path": str(path)},
            "probe": {"at": ["0", "3"], "target": "label", **block}}


def test_listed_targets_of_one_class_are_refused_before_any_batch(tmp_path) -> None:
    data = Listed(classes=1)
    assert len(np.unique(data.targets)) == 1
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg(tmp_path / "p.h5"), model=net(), dataset=data)
    assert "the run's items hold 1 class(es) ([0])" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "p.h5").exists()


def test_the_run_s_items_count_not_the_whole_data_set(tmp_path) -> None:
    data = Listed(n=40)
    data.targets = [0] * 16 + [1] * 24  # data.limit=2: the run's 16 items are all class 0
    with pytest.raises(ConfigError, match=r"the run's items hold 1 class"):
        hookrun.run({**cfg(tmp_path / "p.h5"), "data": {"batch_size": B, "limit": 2}}, model=net(), dataset=data)
    assert not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("method", ["logistic", "ridge"])
def test_items_of_one_class_are_refused_at_the_end_of_the_pass(tmp_path, method) -> None:
    data = [(x, 2) for x, _ in Listed(classes=2)]  # a plain list: its targets are known only batch by batch
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg(tmp_path / "p.h5", method=method), model=net(), dataset=data)
    text = str(err.value)
    assert f"the data's targets hold 1 class(es) ([2]) over {N} rows" in text and "\n" not in text
    with h5py.File(tmp_path / "p.h5") as f:
        assert f.attrs["status"] != "complete" and "probe" not in f


def rare_in_test(n: int = N, test: float = 0.25, seed: int = 0) -> list[int]:
    """Targets with one item of class 1, one that scikit-learn's train_test_split puts in the test items."""
    from sklearn.model_selection import train_test_split

    rare = train_test_split(list(range(n)), test_size=test, random_state=seed)[1][0]
    return [int(i == rare) for i in range(n)]


@pytest.mark.parametrize("listed", [True, False])
def test_a_class_the_split_puts_only_in_the_test_items_is_named(tmp_path, listed) -> None:
    """Two classes in the data, one in the training items (the rare class's one item drawn for the
    test): before any batch where the data set lists its targets, else before any solver; the line
    names the class and what would help. Another split.seed puts it in the training items and runs."""
    pytest.importorskip("sklearn")
    data = Listed()
    data.targets = rare_in_test()
    items = data if listed else [(x, y) for x, y in zip(data.x, data.targets, strict=True)]
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg(tmp_path / "p.h5"), model=net(), dataset=items)
    assert str(err.value) == ("probe.target" + ("" if listed else " at 0") + ": the training rows hold 1 class(es) "
                              "([0]) and a probe needs at least 2: the split put every row of class(es) [1] in the test "
                              "rows; give more items of that class, or another probe.split.seed")
    assert listed != (tmp_path / "p.h5").exists()  # listed: refused before the file
    rare = data.targets.index(1)
    seed = next(s for s in range(1, 50) if rare not in split_items(np.arange(N), 0.25, s))
    table = hookrun.run({**cfg(tmp_path / "q.h5", split={"test": 0.25, "seed": seed})}, model=net(), dataset=items)
    assert table.status == "complete"


@pytest.mark.slow
def test_the_cli_exits_non_zero_with_one_line(tmp_path) -> None:
    out = cli("model=tiny_cnn", "data=shapes", "data.dataset.size=16", "data.batch_size=8", "device=cpu",
              "progress=false", "+probe.at=[block1]", "+probe.target={_target_: test_probe_classes.zeros}",
              "hydra.run.dir=run", cwd=tmp_path,
              env={"PYTHONPATH": os.pathsep.join([ENV["PYTHONPATH"], str(Path(__file__).parent), str(Path(__file__).parents[1])])})
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if "class(es)" in line]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        assert f.attrs["status"] != "complete" and "probe" not in f


def zeros(batch) -> torch.Tensor:
    """A target function giving every item class 0."""
    return torch.zeros(len(batch[0]), dtype=torch.long)
