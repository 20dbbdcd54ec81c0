"""The batches of a run are one range, the counts derive from it, and a rank's shard is a sub-range.
References: sample indices computed by hand, and the dataset's own items."""

from __future__ import annotations

import h5py
import numpy as np
import torch
from conftest import BATCH, N, make_cfg, small_resnet

from hookrun.config import load
from hookrun.output.process import Ranks
from hookrun.output.shards import ShardRun
from hookrun.runner import execute
from hookrun.runner.prepare import prepare


def test_a_shards_range_runs_exactly_its_batches(tmp_path, checkpoint, dataset):
    # N=12 samples in batches of 5 -> batches 0..2 (the last holds 2); 3 ranks: rank 2 gets batch 2
    hooks = {"f": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "input"}]}}
    cfg = load(make_cfg(tmp_path, checkpoint, hooks, **{"data.batch_size": 5}))
    p = prepare(cfg)
    assert p.batches == range(3) and p.n_batches == 3 and p.n_samples == N
    ShardRun(cfg, Ranks(rank=2, world=3)).adjust(p)
    assert p.batches == range(2, 3) and p.n_batches == 1 and p.n_samples == N - 10
    try:
        execute(p, None, 0.0)
    finally:
        p.env.close()
    with h5py.File(cfg.output.path, "r") as f:
        np.testing.assert_array_equal(f["samples/index"][:], [10, 11])
        np.testing.assert_array_equal(f["samples/step"][:], [2, 2])
        rows = f["captures/f/fc/input"][:]
    model = small_resnet()  # the reference: fc's input from a raw hook on the same weights
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    seen = []
    model.fc.register_forward_hook(lambda m, i, o: seen.append(i[0].detach().clone()))
    with torch.no_grad():
        model.eval()(torch.stack([dataset[i][0] for i in (10, 11)]))
    np.testing.assert_allclose(rows, seen[0].numpy(), rtol=1e-5, atol=1e-6)
    assert BATCH != 5  # the override above, not the default, made the batches
