"""The logit lens' rows go by the model's depth, whatever its names: a TransformerLens model's hook points
sorted by name put `hook_embed` and `hook_pos_embed` after `blocks.1` (and labelled the first block
`embed`). Each row is checked against its module's mean over the samples, from h5py and numpy."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from tl_models import hooked_transformer

import hookrun
from hookrun.analysis.report.lens_figures import lens_specs

DEPTH = ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]  # as the forward runs them


@pytest.mark.parametrize("checksum", [True, False], ids=["firing_order", "no_checksums_by_name"])
def test_a_transformer_lens_models_lens_rows_go_by_depth(tmp_path, checksum):
    g = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(0, 40, (8,), generator=g)} for _ in range(3)]
    lens = {"name": "logit_lens", "norm": "ln_final", "unembed": "unembed", "top_k": 3, "target": "input_ids", "target_shift": 1}
    cfg = {"hooks": {"lens": {"at": ["blocks.*.hook_resid_post", "hook_pos_embed", "hook_embed"], "type": "forward", "actions": [lens]}},
           "data": {"batch_size": 3, "target": None, "inputs": {"input": "input_ids"}}, "progress": False,
           "output": {"path": str(tmp_path / "l.h5"), "checksum": checksum}}
    path = hookrun.run(cfg, model=hooked_transformer(d_vocab=40), dataset=items).path
    with h5py.File(path, "r") as f:
        want = [np.nanmean(f[f"captures/lens/{m}/lens.kl_to_final"][:].astype(np.float64), 0) for m in DEPTH]
    with hookrun.open_run(path) as run:
        spec = next(s for s in lens_specs(run, 1) if "KL" in s.title and "mean" in s.title)
    assert list(spec.y) == DEPTH  # (two modules before the blocks: each row keeps its module's name)
    np.testing.assert_allclose(spec.z, np.array(want)[:, : spec.z.shape[1]], rtol=1e-6)
