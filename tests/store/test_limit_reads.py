"""data.limit ends the reading of items, not only the batches run: a data set whose len() (8) says more
items than it has (items 5..7 raise IndexError) runs complete with data.limit=2 batches of 2 (items
0..3), with and without DataLoader workers; the rows equal the model called on those items directly.
Before: the loop fetched batch 2 (items 4, 5) before it checked the limit, so the run failed with
'data: loading batch 2 (items 4..5) failed: IndexError: 5' and the file said `failed`."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from odd_items import Items, Net

import hookrun


@pytest.mark.parametrize("workers", [0, 2])
def test_a_limited_run_reads_no_item_past_its_batches(tmp_path, workers):
    torch.manual_seed(0)
    net = Net().eval()
    path = tmp_path / "run.h5"
    result = hookrun.run({"hooks": {"h": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
                          "data": {"batch_size": 2, "limit": 2, "num_workers": workers, "target": None},
                          "progress": False, "output": {"path": str(path)}}, model=net, dataset=Items("short"))
    assert result.status == "complete" and result.samples == 4
    with torch.no_grad():
        want = net(torch.stack([Items("short")[i][0] for i in range(4)])).numpy()
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete"
        assert f["samples/index"][:].tolist() == [0, 1, 2, 3]
        np.testing.assert_allclose(f["captures/h/fc/output"][:], want, rtol=1e-6, atol=1e-7)
