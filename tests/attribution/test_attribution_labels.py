"""A label out of the model's range in a later batch: one line before any batch where the labels read
without loading the items (a list of items, a TensorDataset, torchvision's `targets`), data.limit's
batches only; otherwise the batch that holds it stops the run with one line and the file marked
failed. Reference: the labels themselves, as the data sets hold them."""

from __future__ import annotations

import h5py
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError, RunError

pytest.importorskip("captum")

BAD = 5  # the bad label's sample: in the 2nd batch of 4


def items(bad=9):
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(1, 32, 32, generator=g), bad if i == BAD else i % 4) for i in range(8)]


class Targets(torch.utils.data.Dataset):
    """torchvision's layout: the labels in `targets`, each item rendered when read."""

    def __init__(self):
        self.rows = items()
        self.targets = [y for _, y in self.rows]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class Built(Targets):
    """Labels only in the items (nothing to read them from without loading each one)."""

    def __init__(self):
        super().__init__()
        del self.targets


def cfg(path, **data):
    return {"progress": False, "device": "cpu", "output": {"path": str(path)}, "data": {"batch_size": 4, **data},
            "attribution": {"method": "saliency", "target": "label"}}


@pytest.mark.parametrize("dataset", [
    lambda: items(),
    lambda: torch.utils.data.TensorDataset(torch.stack([x for x, _ in items()]), torch.tensor([y for _, y in items()])),
    lambda: Targets(),
], ids=["list", "tensor_dataset", "targets"])
def test_a_bad_label_in_a_later_batch_is_one_line_before_any_batch(tmp_path, dataset):
    from hookrun.models.tiny_cnn import tiny_cnn

    ds = dataset()
    assert [int(y) for _, y in (ds[i] for i in range(4))] == [0, 1, 2, 3] and int(ds[BAD][1]) == 9  # the 1st batch is fine
    message = rf"^attribution.target=label: class 9 of sample {BAD} is out of range: the model has 4 classes \(0 to 3\)$"
    with pytest.raises(ConfigError, match=message):
        hookrun.run(cfg(tmp_path / "a.h5"), model=tiny_cnn(), dataset=ds)
    assert not (tmp_path / "a.h5").exists()
    with pytest.raises(ConfigError, match=message):
        hookrun.attribute(tiny_cnn(), ds, batch_size=4, method="saliency")
    hookrun.run(cfg(tmp_path / "b.h5", limit=1), model=tiny_cnn(), dataset=ds)  # data.limit: only the 1st batch is read
    assert hookrun.open_run(tmp_path / "b.h5").attribution()["target"].values.tolist() == [0, 1, 2, 3]


def test_labels_only_in_the_items_stop_the_batch_that_holds_them_and_the_file_is_failed(tmp_path):
    from hookrun.models.tiny_cnn import tiny_cnn

    with pytest.raises(RunError, match=r"^attribution.target=label: class 9 is out of range: the model has 4 classes"):
        hookrun.run(cfg(tmp_path / "c.h5"), model=tiny_cnn(), dataset=Built())
    with h5py.File(tmp_path / "c.h5") as f:
        assert f.attrs["status"] == "failed"
