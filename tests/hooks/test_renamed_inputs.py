"""Dict items whose keys are not the model's argument names, mapped with
`data.inputs={input_ids: ids, attention_mask: mask}`: the mask the model is given is the one the
actions use (token rows, masked means) and the one loss=lm reads. Before, only an item key named
`attention_mask` was looked for: padding became token rows and entered the means, silently.
References: a raw forward hook on the same tiny GPT-2, the mask applied by hand, and
F.cross_entropy over the real next tokens."""

from __future__ import annotations

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from toy_lm import Renamed, tiny_gpt2

import hookrun
from hookrun.runner.calls import CallSpec
from hookrun.runner.losses import lm

RENAMED = {"input_ids": "ids", "attention_mask": "mask"}


def test_renamed_mask_rules_token_rows_and_masked_means(tmp_path):
    model, ds = tiny_gpt2(0).eval(), Renamed(side="right")
    hooks = {"r": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]},
             "m": {"at": "transformer.h.1", "type": "forward",
                   "actions": [{"name": "record", "what": "output", "reduce": "mean", "dims": ["token"]}]}}
    cfg = {"data": {"batch_size": 4, "inputs": RENAMED, "target": None}, "device": "cpu", "progress": False,
           "hooks": hooks, "output": {"path": str(tmp_path / "c.h5")}}
    hookrun.run(cfg, model=model, dataset=ds)
    ids = torch.stack([it["ids"] for it in ds.items])
    mask = torch.stack([it["mask"] for it in ds.items])
    got = {}
    hs = [model.transformer.h[i].register_forward_hook(lambda m, a, o, i=i: got.__setitem__(i, o[0] if isinstance(o, tuple) else o))
          for i in (0, 1)]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    for h in hs:
        h.remove()
    real = mask.bool()
    want_rows = got[0][real].numpy()
    keep = mask.unsqueeze(-1).float()
    want_mean = ((got[1] * keep).sum(1) / keep.sum(1)).numpy()
    with h5py.File(tmp_path / "c.h5") as f:
        rows = f["captures/r/transformer.h.0/output"][:]
        assert rows.shape[0] == int(mask.sum()) < mask.numel()  # padding left no row
        np.testing.assert_allclose(rows, want_rows, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(f["captures/m/transformer.h.1/output"][:], want_mean, rtol=1e-5, atol=1e-6)


def test_loss_lm_reads_the_renamed_input_ids_and_mask():
    model, ds = tiny_gpt2(0).eval(), Renamed(side="right")
    spec = CallSpec(inputs=RENAMED, target=None)
    spec.check(ds[0])
    batch = {k: torch.stack([it[k] for it in ds.items[:4]]) for k in ("ids", "mask")}
    call = spec.split(batch)
    with torch.no_grad():
        logits = model(**call.kwargs).logits
    ids, mask = batch["ids"], batch["mask"]
    keep = (mask[:, 1:] * mask[:, :-1]).bool()
    want = F.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep])
    torch.testing.assert_close(lm(logits, None, batch=call.batch), want)
