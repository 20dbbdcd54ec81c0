"""Reading a run of many processes. A `record limit: N` capture whose N rows span two ranks' shards: the merged view reads whole with
plain h5py (`d[()]`, `np.asarray(d)`) and equals the one-process file. (The view declared each
source as `rows` rows of a shard holding more: HDF5's read of the whole dataset took every row of
the source and failed, 'src and dest dataspaces have different number of elements selected'.)

The shards are written by the real run, in this process, one rank after the other: only the
ranks' rendezvous (a dist store every rank waits on) is left out; the view is store.merge's.
Where the shards lie there with no view (every rank stopped before rank 0 wrote it), inspect names
them and their states, and resume=true (it said only "no file captures.h5")."""

from __future__ import annotations

import h5py
import numpy as np

import hookrun
import hookrun.runner as run_module
from hookrun.cli.inspect_command import main as inspect_main
from hookrun.output.process import Ranks
from hookrun.output.ranks import shard_path
from hookrun.output.shards import ShardRun
from hookrun.store.merge import build_view

NAME = "captures/first/head/output"


def cfg(path) -> dict:  # 10 samples in 5 batches of 2: rank 0 has batches 0-1 (4 rows), rank 1 batches 2-4 (6)
    return {"model": {"_target_": "my_pkg.Net", "width": 4}, "device": "cpu", "progress": False,
            "data": {"dataset": {"_target_": "my_pkg.MyData", "n": 10}, "batch_size": 2},
            "hooks": {"first": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output", "limit": 8}]}},
            "output": {"path": str(path)}}


def test_a_limit_spanning_two_shards_reads_whole_with_plain_h5py(tmp_path, monkeypatch, capsys):
    single = hookrun.run(cfg(tmp_path / "one.h5")).path
    merged = tmp_path / "ranks" / "captures.h5"
    monkeypatch.setattr(ShardRun, "run", lambda self, body: body(self.layout.rank_cfg(), self.layout.mine, self.adjust))
    for rank in range(2):
        monkeypatch.setattr(run_module, "detect", lambda rank=rank: Ranks(rank, 2, 0, "submitit", "t"))
        hookrun.run(cfg(merged))
    shards = [shard_path(merged, r) for r in range(2)]
    assert inspect_main([str(merged.parent)]) == 2  # (rank 0 stopped while it merged: complete shards, no view)
    assert "captures.rank-00000.h5 (complete, 2 batches), captures.rank-00001.h5 (complete, 3 batches); run the same " \
           "command with resume=true" in capsys.readouterr().err
    build_view(merged, shards, {"config": "{}"})
    with h5py.File(single) as one, h5py.File(merged) as view, h5py.File(shards[1]) as rank1:
        want, d = one[NAME][()], view[NAME]
        assert d.is_virtual and list(d.attrs["shard_rows"]) == [4, 4] and rank1[NAME].shape[0] == 6  # 4 of rank 1's 6 rows
        for got in (d[()], d[...], np.asarray(d), d[:]):
            assert got.shape == want.shape == (8, *one[NAME].shape[1:])
            np.testing.assert_array_equal(got, want)


def test_inspect_of_a_folder_of_killed_shards_names_them_and_resume(tmp_path, capsys):
    """torchrun's whole group killed: both shards `running`, no view (as test_ranks.py builds shards)."""
    for rank in range(2):
        with h5py.File(shard_path(tmp_path / "captures.h5", rank), "w") as f:
            f.attrs.update(status="running", format_version="1", steps_complete=rank + 1)
            f["samples/index"] = np.arange(4 * rank, 4 * rank + 4)
            f.create_group("captures")
    (tmp_path / "other.rank-00000.h5").touch()  # another view's shard: not named
    assert inspect_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"hookrun.inspect: error: no file '{tmp_path / 'captures.h5'}', but the shards of a run of many processes beside "
        "it (it stopped before its merged view was written): captures.rank-00000.h5 (running, 1 batches), "
        "captures.rank-00001.h5 (running, 2 batches); run the same command with resume=true to finish them and write the view")
    assert inspect_main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.strip() == f"hookrun.inspect: error: no file '{tmp_path / 'nothing'}'"


def test_the_views_overflow_count_is_every_ranks(tmp_path, monkeypatch):
    """`overflow_values` is the run's count (docs/format.md): a view of two ranks' shards held the first
    shard's alone (its attributes copied), so a float16 cache whose overflow was on rank 1 read 0."""
    big = {"name": "modify_output", "op": "scale", "factor": 1e6}
    hooks = {"first": {"at": "head", "type": "forward",
                       "actions": [big, {"name": "record", "what": "output", "dtype": "float16"}]}}
    single = hookrun.run(cfg(tmp_path / "one.h5") | {"hooks": hooks}).path
    merged = tmp_path / "ranks" / "captures.h5"
    monkeypatch.setattr(ShardRun, "run", lambda self, body: body(self.layout.rank_cfg(), self.layout.mine, self.adjust))
    for rank in range(2):
        monkeypatch.setattr(run_module, "detect", lambda rank=rank: Ranks(rank, 2, 0, "submitit", "t"))
        hookrun.run(cfg(merged) | {"hooks": hooks})
    shards = [shard_path(merged, r) for r in range(2)]
    build_view(merged, shards, {"config": "{}"})
    with h5py.File(single) as one, h5py.File(merged) as view:
        want = int(np.isinf(one[NAME][()]).sum())  # (the model's own outputs are finite: every inf is the cast's)
        counts = []
        for s in shards:
            with h5py.File(s) as f:
                counts.append(int(f[NAME].attrs.get("overflow_values", 0)))
        assert min(counts) > 0 and one[NAME].attrs["overflow_values"] == want == sum(counts)
        assert view[NAME].attrs["overflow_values"] == want and int(np.isinf(view[NAME][()]).sum()) == want
