"""The logit lens' mean picture names in each cell the top-1 token most samples share: it was counted over
the first 4,096 samples only (the reading block), and the title said 'mean over 5000 samples'. Now it is
counted over every sample, streamed a block at a time. Reference: the file's top-1 ids read with h5py,
counted per layer and position with numpy (the lowest id among equal counts)."""

from __future__ import annotations

import h5py
import numpy as np
import torch
from tl_models import hooked_transformer

import hookrun
from hookrun.analysis.report.lens_figures import BLOCK, lens_specs

MODULES = ["hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]


def most_common(ids: np.ndarray) -> list[list[int]]:
    """[layer][position]: the id most rows hold (ties: the lowest)."""
    return [[int(np.bincount(ids[k][:, p]).argmax()) for p in range(ids.shape[2])] for k in range(ids.shape[0])]


def test_the_mean_pictures_top1_token_counts_every_sample(tmp_path):
    g = torch.Generator().manual_seed(0)
    n, extra = BLOCK + 904, torch.randint(0, 40, (8,), generator=g)
    items = [{"input_ids": torch.randint(0, 40, (8,), generator=g)} for _ in range(BLOCK)]
    items += [{"input_ids": extra.clone()} for _ in range(n - BLOCK)]  # (the samples past the block: one prompt)
    lens = {"name": "logit_lens", "norm": "ln_final", "unembed": "unembed", "top_k": 1}
    cfg = {"hooks": {"lens": {"at": MODULES, "type": "forward", "actions": [lens]}},
           "data": {"batch_size": 1000, "target": None, "inputs": {"input": "input_ids"}}, "progress": False,
           "output": {"path": str(tmp_path / "l.h5")}}
    path = hookrun.run(cfg, model=hooked_transformer(d_vocab=40), dataset=items).path
    with h5py.File(path, "r") as f:
        ids = np.stack([f[f"captures/lens/{m}/lens.top_ids"][:, :, 0].astype(np.int64) for m in MODULES])
    assert ids.shape == (3, n, 8)
    want, first_block = most_common(ids), most_common(ids[:, :BLOCK])
    assert want != first_block  # (the samples past the first block change some cell's answer)

    with hookrun.open_run(path) as run:
        mean = [s for s in lens_specs(run, 0) if f"mean over {n} samples" in s.title]
    assert mean
    for spec in mean:
        assert [[int(t) for t in row] for row in spec.cells] == want
