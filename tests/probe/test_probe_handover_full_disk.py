"""A rank's probe rows handed to rank 0 (RankLink.hand_over of ProbeKind.save_rows, an HDF5 file in the run
folder) onto a disk that refuses the write (a file-size limit: EFBIG, as a full disk gives ENOSPC;
tests/helpers/file_limit.py): one RunError line naming the file and the reason, and no part left, cut off,
under the temporary name or the final one. Before: h5py's RuntimeError ('Can't decrement id ref count (file
write failed ...)') came up as a traceback after the rank's whole shard was computed, and the cut-off
`.tmp` stayed in the run folder. With room, rank 0 reads back the rows themselves."""

from __future__ import annotations

import json

import numpy as np
from file_limit import limited_run

SCRIPT = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
import numpy as np, torch, torch.distributed as dist
from hookrun.errors import HookrunError
from hookrun.output.rank_link import RankLink
from hookrun.output.process import Ranks
from hookrun.runner.kinds.probe.kind import ProbeKind
from hookrun.runner.kinds.probe.rows import RowStore

folder = Path(sys.argv[1])
folder.mkdir(exist_ok=True)  # (the run folder)
x = np.random.default_rng(0).standard_normal((2000, 16))
rows = RowStore(16, 1 << 30)
for start in range(0, 2000, 100):  # 20 batches, in memory
    part = slice(start, start + 100)
    rows.add(torch.from_numpy(x[part]), np.arange(2000)[part] % 3, np.arange(2000)[part], np.arange(2000)[part])
kind = SimpleNamespace(names=["block1"], stores={"block1": rows})
store = dist.HashStore()
l0, l1 = (RankLink(store, Ranks(rank=r, world=2), folder, "job") for r in (0, 1))
l0.want("probe")
try:
    l1.hand_over("probe", lambda path: ProbeKind.save_rows(kind, path))
except HookrunError as exc:
    print(json.dumps({"error": type(exc).__name__, "line": str(exc)}))
    sys.exit(1)
got = RowStore(16, 1 << 30)
l0.gather("probe", lambda path: ProbeKind.load_rows(SimpleNamespace(names=["block1"], stores={"block1": got}), path))
print(json.dumps({"x": np.concatenate([b.numpy() for _, b in got.blocks()]).tolist(), "y": got.column("y").tolist()}))
"""


def test_a_handover_the_disk_refuses_is_one_line_and_leaves_no_part(tmp_path):
    folder = tmp_path / "run"
    failed = limited_run(["-c", SCRIPT, str(folder)], cwd=tmp_path, limit=100 << 10)  # the rows are 256 KB
    assert failed.returncode == 1, failed.stderr[-3000:]
    out = json.loads(failed.stdout.strip().splitlines()[-1])
    assert out["error"] == "RunError"
    assert out["line"].startswith(f"probe: writing rank 1's part for rank 0 to {folder}/"), out["line"]
    assert "File too large" in out["line"] and out["line"].endswith("and run again with resume=true")
    assert "\n" not in out["line"]
    assert sorted(p.name for p in folder.iterdir() if "probe" in p.name) == []  # no part, whole or cut off

    whole = limited_run(["-c", SCRIPT, str(folder)], cwd=tmp_path)  # room: rank 0 gets the rows themselves
    assert whole.returncode == 0, whole.stderr[-3000:]
    got = json.loads(whole.stdout.strip().splitlines()[-1])
    x = np.random.default_rng(0).standard_normal((2000, 16))
    np.testing.assert_array_equal(np.array(got["x"]), x)
    assert got["y"] == (np.arange(2000) % 3).tolist()
