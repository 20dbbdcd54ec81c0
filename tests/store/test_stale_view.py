"""A merged view older than its shards. A run on many processes rerun with output.overwrite=true (or a
shard copied over) and stopped before rank 0 wrote its new view left the old view in place: open_run
and inspect read it as `complete`, mapping the new shards' rows by the old counts (rows past a
shard's end read as zeros, /samples/index [0..23, 0..23, 0, 0] for 50 samples), and inspect failed
with a traceback ('component not found') on a capture the new run did not record. Readers now
compare each shard with the view (its sample count, `created`, status) and refuse in one line.
Reference: the model called directly on the items."""

from __future__ import annotations

import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT

import hookrun
from hookrun.errors import HookrunError
from hookrun.output.ranks import shard_path
from hookrun.store.merge import build_view

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(4, 3))
ITEMS = [torch.randn(4) for _ in range(8)]


def write(path, items, hooks=("h",)):
    hookrun.run({"hooks": {h: {"at": "0", "type": "forward"} for h in hooks}, "progress": False,
                 "data": {"batch_size": 2}, "output": {"path": str(path), "overwrite": True}}, model=MODEL, dataset=items)


def test_a_view_whose_shards_were_written_again_is_refused_in_one_line(tmp_path):
    view, shards = tmp_path / "captures.h5", [shard_path(tmp_path / "captures.h5", r) for r in range(2)]
    write(shards[0], ITEMS[:4], hooks=("h", "old"))
    write(shards[1], ITEMS[4:], hooks=("h", "old"))
    assert build_view(view, shards, {"config": "{}"}).status == "complete"
    with hookrun.open_run(view) as run, torch.no_grad():  # the view as written reads the model's outputs
        np.testing.assert_allclose(run["h", "0", "output"][:], MODEL(torch.stack(ITEMS)).numpy(), rtol=1e-6)
    time.sleep(1.1)  # (`created` has whole seconds)
    write(shards[1], ITEMS[4:7])  # written again, 3 items, without the `old` capture; no new view
    with h5py.File(view) as f:  # what plain HDF5 makes of it: the old count, a zero row past the new shard's end
        assert f.attrs["status"] == "complete" and list(f["samples/index"][:]) == [0, 1, 2, 3, 0, 1, 2, 0]
    want = (f"{view} is older than its shard captures.rank-00001.h5: the view maps 4 samples of a complete shard, "
            f"which now holds 3 samples (complete, created ")
    with pytest.raises(HookrunError) as exc:
        hookrun.open_run(view)
    assert str(exc.value).startswith(want) and str(exc.value).endswith(
        "a later run wrote the shards again and has not written its view (it runs, or it stopped); once it has "
        "stopped, run its command again with resume=true (without output.overwrite=true) to finish it and write the view")
    proc = subprocess.run([sys.executable, "-m", "hookrun.inspect", str(view)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == f"hookrun.inspect: error: {exc.value}\n"


def test_a_shard_written_again_with_as_many_samples_is_refused(tmp_path):
    view, shards = tmp_path / "captures.h5", [shard_path(tmp_path / "captures.h5", r) for r in range(2)]
    for shard, items in zip(shards, (ITEMS[:4], ITEMS[4:]), strict=True):
        write(shard, items)
    build_view(view, shards, {"config": "{}"})
    time.sleep(1.1)
    write(shards[0], ITEMS[4:])  # the same count, other rows: only its `created` tells
    with pytest.raises(HookrunError, match=r"older than its shard captures.rank-00000.h5: the view maps 4 samples of a "
                                           r"complete shard, which now holds 4 samples \(complete, created"):
        hookrun.open_run(view)
    build_view(view, shards, {"config": "{}"})  # the view written anew reads the new rows
    with hookrun.open_run(view) as run, torch.no_grad():
        np.testing.assert_allclose(run["h", "0", "output"][:], MODEL(torch.stack(ITEMS[4:] * 2)).numpy(), rtol=1e-6)
