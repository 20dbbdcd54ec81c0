"""A grid with two `over` axes is drawn as module x axis heatmaps, one per index of the other axis
(plot's grid_*.png, the report's grids): where that made more than 16 planes, the planes after the
16th were dropped without a word, and with over [head, query] those were the last query positions,
the ones where a logit_diff at position -1 moves. Checked against the file's cells read with h5py."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import hookrun

pytest.importorskip("transformers")
from hookrun.runner.kinds.patching.report import grid_specs  # noqa: E402

SITE = '+patching.sites={pat: {at: "transformer.h.*.attn/softmax", over: [head, query], dims: [sample, head, query, key]}}'


def test_every_cell_of_a_grid_with_more_than_16_planes_is_drawn_or_said(tmp_path):
    cfg = hookrun.compose("experiment=patching_grid", "data.dataset.n=2", "data.dataset.length=20", "progress=false",
                          "~patching.sites", SITE, f"output.path={tmp_path / 'c.h5'}")
    path = hookrun.run(cfg).path
    with h5py.File(path) as f:
        layout = json.loads(f.attrs["patching"])["layout"]["pat"]
        cells = f["captures/patching/cells/value"][:].reshape(len(layout["modules"]), *layout["sizes"])  # module, head, query
    heads, queries = layout["sizes"]
    assert queries > 16 > heads and np.isfinite(cells).all()
    with hookrun.open_run(path) as run:
        specs = next(s for name, _, s in grid_specs(run) if name == "pat")
    drawn = [np.asarray(s.z) for s in specs]
    assert len(drawn) == heads  # a module x query plane per head: every cell drawn once
    for h, z in enumerate(drawn):
        np.testing.assert_array_equal(z, cells[:, h, :])
        assert specs[h].title.startswith(f"pat · head {h} · ") and specs[h].xlabel == "query"
    assert np.abs(cells[:, :, -1]).max() > 0  # (the last query, where the metric is read, is in them)
