"""record's reduce on a float16 / bfloat16 model: against float64 numpy of the same activations."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun


class Embed(torch.nn.Module):
    """Token vectors of about 3000: 32 of them sum past float16's 65504, their mean does not."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 8)
        with torch.no_grad():
            self.emb.weight.uniform_(2000, 4000, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids, attention_mask=None):
        return self.emb(input_ids)


class Texts(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        mask = torch.ones(32, dtype=torch.long)
        mask[24 + i % 4:] = 0  # right padding of 4 to 8 tokens
        return {"input_ids": torch.randint(0, 64, (32,), generator=torch.Generator().manual_seed(i)), "attention_mask": mask}


@pytest.mark.parametrize("dtype, half_ulp", [(torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)])
@pytest.mark.parametrize("reduce, ref", [("mean", lambda v: v.mean(0)), ("norm", lambda v: np.sqrt((v**2).sum(0)))])
def test_a_half_models_token_mean_and_norm_are_its_float64_values_rounded_once(tmp_path, dtype, half_ulp, reduce, ref):
    model = Embed().to(dtype).eval()
    hooks = {"r": {"at": "emb", "type": "forward", "actions": [{"name": "record", "what": "output", "reduce": reduce, "dims": "token"}]}}
    path = tmp_path / "half.h5"
    hookrun.run({"data": {"batch_size": 4, "store": ["input_ids", "attention_mask"]}, "device": "cpu", "progress": False,
                 "hooks": hooks, "output": {"path": str(path)}}, model=model, dataset=Texts())
    with h5py.File(path) as f:
        got = f["captures/r/emb/output"][:].astype(np.float64)
        ids, mask = f["samples/input_ids"][:], f["samples/attention_mask"][:].astype(bool)
    table = model.emb.weight.detach().double().numpy()  # the model's own (half) values, exactly
    want = np.stack([ref(table[ids[i][mask[i]]]) for i in range(len(ids))])
    assert np.isfinite(got).all()  # (float16: the masked mean was inf, its sum over 24+ tokens past 65504)
    np.testing.assert_allclose(got, want, rtol=half_ulp * 1.01, atol=0)
