"""experiment=sae_cache: float16 token rows of the residual stream, equal to raw hooks on the same
GPT-2 (the shipped model=tiny_lm, read by transformers itself), read back by the loader and trained
on by the `sae:` kind's engine (SAELens' trainer)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT
from shipped_configs import composed

import hookrun
from hookrun.errors import ConfigError
from hookrun.sae import load_sae

transformers = pytest.importorskip("transformers")
BLOCKS = ["transformer.h.1", "transformer.h.2", "transformer.h.3"]


def test_sae_cache_records_token_rows_like_raw_hooks(tmp_path):
    cfg = composed("experiment=sae_cache", "progress=false", "device=cpu", f"output.path={tmp_path / 'c.h5'}")
    hookrun.run(cfg)
    # the reference: the shipped weights read by transformers, on the stored inputs
    model = transformers.GPT2LMHeadModel.from_pretrained(ROOT / "hookrun/models/tiny_lm", attn_implementation="eager").eval()
    with h5py.File(tmp_path / "c.h5") as f:
        ids = torch.from_numpy(f["samples/input_ids"][:])
        mask = torch.from_numpy(f["samples/attention_mask"][:])
        got = {b: f[f"captures/res/{b}/output"][:] for b in BLOCKS}
        assert f[f"captures/res/{BLOCKS[0]}/output"].attrs["rows"] == "tokens"
    seen = {}
    for b in BLOCKS:
        model.get_submodule(b).register_forward_hook(
            lambda m, i, o, b=b: seen.__setitem__(b, o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    keep = mask.bool()
    for b in BLOCKS:
        want = seen[b][keep].numpy()  # (sample, position) order, padding dropped
        assert got[b].dtype == np.float16 and got[b].shape == want.shape == (int(mask.sum()), 128)
        np.testing.assert_allclose(got[b].astype(np.float32), want, rtol=2e-3, atol=2e-3)
    # the cache trains a sparse autoencoder through the shuffled reader (the sae kind's engine)
    from hookrun.runner.kinds.sae.block import SaeBlock
    from hookrun.runner.kinds.sae.data import CacheRows
    from hookrun.runner.kinds.sae.engine import Training, save_sae

    block = SaeBlock(from_=str(tmp_path / "c.h5"), capture="res/transformer.h.3/output", architecture="standard",
                     d_sae=512, batch_rows=64, rows=2 * len(got["transformer.h.3"]), l1_coefficient=1e-3)
    block.check()
    data = CacheRows(block.from_, block.capture, block.batch_rows, block.shuffle)
    train = Training(block, data.d_in, data.info.module, data)
    sae = train.fit()
    data.close()
    assert all(np.isfinite(log["losses/overall_loss"]) for log in train.logs)
    # saved as an SAELens folder, it reads back as the SAE of transformer.h.3 and fits that block's output
    loaded = load_sae(save_sae(sae, tmp_path / "sae"))
    assert loaded.hook_name == "transformer.h.3" and (loaded.d_in, loaded.d_sae) == (128, 512)
    loaded.check_fits(seen["transformer.h.3"].shape, "transformer.h.3's output")
    with pytest.raises(ConfigError, match="reads d_in=128 but lm_head's output has 50 features"):
        loaded.check_fits(50, "lm_head's output")
    x = torch.from_numpy(got["transformer.h.3"].astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), sae(x), rtol=1e-5, atol=1e-5)
