"""A `record limit: N` capture whose N rows span two ranks' shards: the merged view reads whole with
plain h5py (`d[()]`, `np.asarray(d)`) and equals the one-process file. (The view declared each
source as `rows` rows of a shard holding more: HDF5's read of the whole dataset took every row of
the source and failed, 'src and dest dataspaces have different number of elements selected'.)

The shards are written by the real run, in this process, one rank after the other: only the
ranks' rendezvous (a dist store every rank waits on) is left out; the view is store.merge's."""

from __future__ import annotations

import h5py
import numpy as np

import hookrun
import hookrun.runner.run as run_module
from hookrun.output.ranks import Ranks, shard_path
from hookrun.output.shards import ShardRun
from hookrun.store.merge import build_view

NAME = "captures/first/head/output"


def cfg(path) -> dict:  # 10 samples in 5 batches of 2: rank 0 has batches 0-1 (4 rows), rank 1 batches 2-4 (6)
    return {"model": {"_target_": "my_pkg.Net", "width": 4}, "device": "cpu", "progress": False,
            "data": {"dataset": {"_target_": "my_pkg.MyData", "n": 10}, "batch_size": 2},
            "hooks": {"first": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output", "limit": 8}]}},
            "output": {"path": str(path)}}


def test_a_limit_spanning_two_shards_reads_whole_with_plain_h5py(tmp_path, monkeypatch):
    single = hookrun.run(cfg(tmp_path / "one.h5")).path
    merged = tmp_path / "ranks" / "captures.h5"
    monkeypatch.setattr(ShardRun, "run", lambda self, body: body(self.layout.rank_cfg(), self.layout.mine, self.adjust))
    for rank in range(2):
        monkeypatch.setattr(run_module, "detect", lambda rank=rank: Ranks(rank, 2, 0, "submitit", "t"))
        hookrun.run(cfg(merged))
    shards = [shard_path(merged, r) for r in range(2)]
    build_view(merged, shards, {"config": "{}"})
    with h5py.File(single) as one, h5py.File(merged) as view, h5py.File(shards[1]) as rank1:
        want, d = one[NAME][()], view[NAME]
        assert d.is_virtual and list(d.attrs["shard_rows"]) == [4, 4] and rank1[NAME].shape[0] == 6  # 4 of rank 1's 6 rows
        for got in (d[()], d[...], np.asarray(d), d[:]):
            assert got.shape == want.shape == (8, *one[NAME].shape[1:])
            np.testing.assert_array_equal(got, want)
