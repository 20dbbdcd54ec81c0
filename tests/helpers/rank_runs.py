"""The multi-process CLI runs test_ranks.py and test_object_store_ranks.py share (tests only).

    proc = cli(*ARGS, cwd=tmp_path, launcher=TORCHRUN)   # the command under torchrun, two ranks
    reference = one_process_run(folder)                  # the same command, one process: the reference

ARGS is one small model, 22 samples in batches of 4, grad mode, and hooks of every kind of row
(every sample, every 2nd batch reduced, the first 6 rows, a parameter's grad per step), plus a
user action that kills a rank when the environment says (rank_helpers.kill_when_told).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
from conftest import HELPERS, ROOT

from hookrun.analysis.run_reader import list_captures, row_index

ENV = {"PYTHONPATH": f"{ROOT}{os.pathsep}{HELPERS}", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
HOOKS = ("hooks={fmap: {at: features.0, type: forward, actions: [{name: record, what: output}]},"
         " sparse: {at: features.2, type: forward, actions: [{name: record, what: output, every: 2, reduce: mean}]},"
         " first: {at: head, type: forward, actions: [{name: record, what: output, limit: 6}]},"
         " pg: {at: head.weight, type: param},"
         " kill: {at: features.0, type: forward, actions: [{_target_: rank_helpers.kill_when_told, _partial_: true}]}}")
ARGS = ["model=custom", "model._target_=my_pkg.Net", "+model.width=4", "data=custom", "data.dataset._target_=my_pkg.MyData",
        "+data.dataset.n=22", "data.batch_size=4", "device=cpu", "progress=false", "mode=grad", "loss=cross_entropy",
        "output.flush_every=1", HOOKS]


def cli(*args: str, cwd: Path, launcher: list[str] | None = None, env: dict | None = None, timeout: int = 300):
    full = {**os.environ, **ENV, **(env or {})}
    full.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, *(launcher or []), "-m", "hookrun", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full)


TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def captures(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every capture's rows and row index, and the /samples datasets, read with plain h5py."""
    out = {}
    with h5py.File(path, "r") as f:
        for c in list_captures(f):
            out[c.path] = (f[c.path][()], row_index(f, f[c.path]))
        for name in f["samples"]:
            out[f"samples/{name}"] = (f["samples"][name][()], np.zeros(0))
    return out


def one_process_run(folder: Path) -> Path:
    """ARGS run by one process into `folder`/one (the reference the multi-process runs must equal)."""
    proc = cli(*ARGS, "hydra.run.dir=one", cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder / "one" / "captures.h5"


def shard_state(folder: Path, rank: int) -> tuple[str, list[int]]:
    """Rank `rank`'s shard in `folder`: its status and the steps (batches) it holds."""
    with h5py.File(folder / f"captures.rank-{rank:05d}.h5", "r") as f:
        return str(f.attrs["status"]), sorted(set(f["samples/step"][:].tolist()))
