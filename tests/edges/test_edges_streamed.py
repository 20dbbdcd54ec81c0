"""A bounded edges file run writes its grid as it goes (runner/kinds/patching/kind.py, edges/bounded.py): each
reader group's columns are put as one step the moment the backward has finished them.

References: the raw-torch EAP-IG of tests/edges/test_edges.py (TransformerLens' own backward hooks, one item at a
time) and the unbounded in-memory run. A run stopped by SIGINT at its first reader group holds part of the
grid, which `edges()` refuses to read as a grid; resumed, it equals the references."""

from __future__ import annotations

import os
import re
import signal

import h5py
import numpy as np
import pytest
import test_edges as lens_ref
import test_edges_memory as bounded_ref
from tl_models import hooked_transformer

import hookrun
from hookrun.circuits import main as circuits_main
from hookrun.output.process import Interrupted
from hookrun.runner.kinds.patching import kind as patching_kind
from hookrun.runner.kinds.patching.edges.graph import find_graph

M = 3


@pytest.fixture(scope="module")
def lens():
    return hooked_transformer(lens_ref.V, n_layers=lens_ref.L, d_model=16, n_ctx=8, d_head=4, n_heads=lens_ref.H,
                              act_fn="gelu")


def cfg(path, memory):
    return {"data": {"inputs": {"input": "clean"}, "target": None}, "progress": False,
            "output": {"path": str(path), "flush_every": 1},
            "patching": {"input": "input", "method": "eap_ig", "ig_steps": M, "memory": memory}}


def test_a_stopped_bounded_run_holds_part_of_the_grid_and_resumes_to_the_reference(tmp_path, lens, monkeypatch, capsys):
    items = bounded_ref.lens_items()
    kw = {"input": "input", "method": "eap_ig", "ig_steps": M}
    unbounded = hookrun.patch_grid(lens, items, **kw)["edges"]
    memory = bounded_ref.budget_floor(lens, items, **kw)
    groups: list = []
    real = patching_kind.compute_edges

    def stop_at_first_group(*args, sink=None, **kwargs):
        def first(rs, columns):
            groups.append(rs)
            if len(groups) == 1:  # as a user's Ctrl-C: the run stops after this group's step
                os.kill(os.getpid(), signal.SIGINT)
            sink(rs, columns)
        return real(*args, sink=first, **kwargs)

    monkeypatch.setattr(patching_kind, "compute_edges", stop_at_first_group)
    path = tmp_path / "e.h5"
    with pytest.raises(Interrupted):
        hookrun.run(cfg(path, memory), model=lens, dataset=items)
    cells = unbounded.size
    with h5py.File(path) as f:
        written = f["samples/index"][:]
        assert f.attrs["status"] == "interrupted"
    first = groups[0]
    assert len(groups) == 1 and len(written) == len(unbounded.writer) * (first.stop - first.start) < cells
    assert sorted(written % len(unbounded.reader)) == sorted(np.repeat(np.arange(first.start, first.stop),
                                                                       len(unbounded.writer)))
    with pytest.raises(LookupError, match=r"holds part of an edge grid \(\d+ of \d+ cells\).*resume it"):
        hookrun.open_run(path).edges()
    assert circuits_main(["export", str(path), "--format", "eap-ig", str(tmp_path / "g.json")]) == 2  # one line, no LookupError
    err = capsys.readouterr().err
    assert re.search(r"holds part of an edge grid \(\d+ of \d+ cells\).*resume it", err) and "Traceback" not in err, err
    assert err.count("\n") == 1 and not (tmp_path / "g.json").exists()

    monkeypatch.setattr(patching_kind, "compute_edges", real)
    resumed = cfg(path, memory)
    resumed["resume"] = True
    assert hookrun.run(resumed, model=lens, dataset=items).status == "complete"
    with h5py.File(path) as f:  # one step per reader group: each written as it was finished
        assert int(f.attrs["steps_complete"]) == len(find_graph(lens, "test")[0].reader_groups) > 1
    run = hookrun.open_run(path)
    assert sorted(run.samples.tolist()) == list(range(cells))
    _, grid = run.edges()
    want, by_position = lens_ref.reference_edges(lens, items, M)
    np.testing.assert_array_equal(np.isnan(grid.values), np.isnan(want))
    np.testing.assert_allclose(grid.values, want, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(grid.values, unbounded.values, atol=1e-7, rtol=1e-5)
    np.testing.assert_allclose(grid.attrs["node_scores"], unbounded.attrs["node_scores"], atol=1e-7, rtol=1e-5)
    np.testing.assert_allclose(grid.attrs["node_scores_by_position"], by_position, atol=1e-5, rtol=1e-4)
