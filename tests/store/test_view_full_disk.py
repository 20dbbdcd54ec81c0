"""Rank 0's merged view over the shards (store/merge.build_view, an HDF5 file of virtual datasets) onto a disk
that refuses the write (a file-size limit: EFBIG, as a full disk gives ENOSPC; tests/helpers/file_limit.py):
one RunError line naming the view and what to do, nothing under the view's name or its temporary one, the
shards untouched. Before: h5py's RuntimeError ('Set slist enabled failed (file write failed ...)') came up as
a traceback, which the rank loop's `except (HookrunError, OSError)` let through even for a failed run."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import torch
from file_limit import limited_run
from toy_runs import lin_cfg

import hookrun

SCRIPT = """
import json, sys
from pathlib import Path
from hookrun.errors import HookrunError
from hookrun.store.merge import build_view
v = Path(sys.argv[1])
try:
    view = build_view(v / "captures.h5", [v / "captures.rank-00000.h5", v / "captures.rank-00001.h5"], {"config": "x"})
except HookrunError as exc:
    print(json.dumps({"error": type(exc).__name__, "line": str(exc)}))
    sys.exit(1)
print(json.dumps({"status": view.status, "samples": view.samples}))
"""


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i))


def test_a_view_the_disk_refuses_is_one_line_and_leaves_nothing(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential()
    m.add_module("lin", torch.nn.Linear(4, 100))
    hookrun.run(lin_cfg(tmp_path / "one"), model=m, dataset=Items())
    folder = tmp_path / "run"
    folder.mkdir()
    shards = [folder / f"captures.rank-0000{r}.h5" for r in (0, 1)]
    for shard in shards:
        shutil.copy(tmp_path / "one" / "c.h5", shard)
    before = [s.read_bytes() for s in shards]

    failed = limited_run(["-c", SCRIPT, str(folder)], cwd=tmp_path, limit=6000)  # the view is ~13 KB
    assert failed.returncode == 1, failed.stderr[-3000:]
    out = json.loads(failed.stdout.strip().splitlines()[-1])
    assert out["error"] == "RunError" and "\n" not in out["line"]
    assert out["line"].startswith(f"writing the merged view {folder / 'captures.h5'} failed: RuntimeError: "), out["line"]
    assert out["line"].endswith("(a run: the same command with resume=true; a reader: open it again)")
    assert sorted(p.name for p in folder.iterdir()) == [s.name for s in shards]
    assert [s.read_bytes() for s in shards] == before

    whole = limited_run(["-c", SCRIPT, str(folder)], cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert json.loads(whole.stdout.strip().splitlines()[-1]) == {"status": "complete", "samples": 16}
    with h5py.File(folder / "captures.h5", "r") as view, h5py.File(shards[0], "r") as shard:
        rows = shard["captures/r/lin/output"][()]
        np.testing.assert_array_equal(view["captures/r/lin/output"][()], np.concatenate([rows, rows]))
