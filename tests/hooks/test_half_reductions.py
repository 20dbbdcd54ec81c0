"""record's reduce on a float16 / bfloat16 model: against float64 numpy of the same activations."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import HookrunError


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


class Loud(torch.nn.Module):
    """A float16 Linear whose outputs are about 30000 each: every value fits float16, the norm of 8 of them (~85000) does not."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 8)
        with torch.no_grad():
            self.lin.weight.uniform_(-100, 100, generator=torch.Generator().manual_seed(1))
            self.lin.bias.fill_(30000.0)

    def forward(self, x):
        return self.lin(x)


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_a_float16_norm_past_float16s_range_is_stored_as_asked_or_counted_as_overflow(tmp_path, dtype):
    """A float16 model's norm summed in float32 was rounded to float16 inside the reduction: inf for a
    norm above 65504, with no count, no warning, and inf even where the record asked for float32. Now it
    is rounded once, to the storage dtype: float32 holds numpy's float64 norm of the same values; kept as
    float16 it is inf, counted in overflow_values as any cast's (and refused by check_finite)."""
    model = Loud().half().eval()
    xs = torch.randn(6, 4, generator=torch.Generator().manual_seed(2)).half()
    with torch.no_grad():
        out = model(xs)
    want = np.linalg.norm(out.double().numpy(), axis=1)  # the model's float16 outputs, exactly, then float64
    assert (want > 65504).all() and torch.isfinite(out).all()
    act = {"name": "record", "what": "output", "reduce": "norm", "dims": 1, **({"dtype": dtype} if dtype else {})}
    path = tmp_path / "norm.h5"
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "output": {"path": str(path)},
           "hooks": {"r": {"at": "lin", "type": "forward", "actions": [act]}}}
    hookrun.run(cfg, model=model, dataset=torch.utils.data.TensorDataset(xs))
    with h5py.File(path) as f:
        ds = f["captures/r/lin/output"]
        got, attrs = ds[:], dict(ds.attrs)
    if dtype == "float32":
        assert got.dtype == np.float32 and "overflow_values" not in attrs
        np.testing.assert_allclose(got, want, rtol=2e-7)
    else:
        assert got.dtype == np.float16 and np.isinf(got).all() and attrs["overflow_values"] == 6
        act["check_finite"] = True
        with pytest.raises(HookrunError, match="float16 holds values up to 65504"):
            hookrun.run({**cfg, "output": {"path": str(tmp_path / "stop.h5")}}, model=model,
                        dataset=torch.utils.data.TensorDataset(xs))
