"""Two ranks on the bounded route (edges/bounded.py): each computes the whole grid within its budget and writes
its own cells of each reader group as the backward finishes it; the merged view equals the unbounded
one-process grid of the same items (which tests/edges/test_edges.py checks against raw torch)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from test_edges_memory import budget_floor

import hookrun

pytest.importorskip("transformers")
SMALL = ["device=cpu", "progress=false", "data.dataset.n=2", "data.dataset.length=8"]


@pytest.mark.slow
def test_two_ranks_stream_their_cells_of_the_bounded_grid(tmp_path):
    from rank_runs import TORCHRUN, cli

    from hookrun.data.swaps import word_swap
    from hookrun.models.tiny_lm import tiny_lm

    model, items = tiny_lm().eval(), word_swap(n=2, length=8)
    want = hookrun.patch_grid(model, items, method="eap")["edges"]
    memory = budget_floor(model, items, method="eap")  # the smallest budget: one reader group's gradient at a time
    proc = cli("experiment=edges", "hydra.run.dir=two", "patching.method=eap", "patching.ig_steps=1",
               f"patching.memory={memory}", *SMALL, cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = [p for p in sorted((tmp_path / "two").glob("**/*.h5")) if p.name != "captures.h5"]
    parities, steps = set(), []
    for shard in shards:
        with h5py.File(shard) as f:
            assert json.loads(f.attrs["patching"]).get("grid_complete") is True
            steps.append(int(f.attrs["steps_complete"]))
            parity = set((f["samples/index"][:] % 2).tolist())
            assert len(parity) == 1, shard  # one rank's cells: every second one
            parities |= parity
    assert parities == {0, 1}, shards
    assert min(steps) > 1  # a step per reader group, not one at the end
    _, grid = hookrun.open_run(tmp_path / "two" / "captures.h5").edges()
    np.testing.assert_array_equal(np.isnan(grid.values), np.isnan(want.values))
    np.testing.assert_allclose(grid.values, want.values, atol=1e-6)
    np.testing.assert_allclose(grid.attrs["node_scores"], want.attrs["node_scores"], atol=1e-6)
