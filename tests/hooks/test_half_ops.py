"""Ops on a bfloat16 / float16 model's activations: the same numbers as a raw forward hook that adds
or scales in the usual way (float values rounded once to the activation's dtype)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun

VEC = [0.37 * (-1) ** i * (1 + i / 7) for i in range(64)]
FACTOR = 3.3
FEATURES = {1: 0.3, 5: 1.7, 40: -2.9}


class Two(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 64), torch.nn.Linear(64, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 4)

    def forward(self, x):
        return self.b(self.a(x))


class Items(torch.utils.data.Dataset):
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i):
        return torch.randn(16, generator=torch.Generator().manual_seed(i)).to(self.dtype)


def steered(tmp_path, model, dtype, op):
    hooks = {"s": {"at": "a", "type": "forward", "actions": [{"name": "modify_output", **op}]},
             "r": {"at": "b", "type": "forward", "actions": [{"name": "record", "what": "input"}]}}
    path = tmp_path / "ops.h5"
    hookrun.run({"data": {"batch_size": 4}, "device": "cpu", "progress": False, "hooks": hooks,
                 "output": {"path": str(path), "overwrite": True}}, model=model, dataset=Items(dtype))
    with h5py.File(path) as f:
        return f["captures/r/b/input.0"][:] if "input.0" in f["captures/r/b"] else f["captures/r/b/input"][:]


def raw_add(x):
    return x + (torch.tensor(VEC, dtype=torch.float64) * FACTOR).to(x.dtype)


def raw_scale_features(x):
    out = x.clone()
    for i, v in FEATURES.items():
        out[..., i] = x[..., i] * v
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op, raw", [({"op": "add", "dim": -1, "value": VEC, "factor": FACTOR}, raw_add),
                                     ({"op": "scale_features", "features": FEATURES}, raw_scale_features)], ids=["add", "scale_features"])
def test_a_half_activation_is_steered_as_a_raw_hook_steers_it(tmp_path, dtype, op, raw):
    model = Two().to(dtype).eval()
    got = steered(tmp_path, model, dtype, op)
    x = torch.stack([Items(dtype)[i] for i in range(12)])
    with torch.no_grad():
        want = raw(model.a(x))
    assert want.dtype == dtype
    np.testing.assert_array_equal(got, want.float().numpy())


def test_capture_keeps_a_bfloat16_record_bfloat16_in_memory():
    """A capture() block holds a bfloat16 record as bfloat16 (a file holds it as float32, numpy having
    none): under keep on a bfloat16 model, and where a float32 model's record asks for bfloat16."""
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    for model_dtype, record_dtype in ((torch.bfloat16, None), (torch.float32, "bfloat16")):
        model = Two().to(model_dtype)
        seen = []
        handle = model.a.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o.detach().clone()))
        action = {"name": "record", "what": "output", **({"dtype": record_dtype} if record_dtype else {})}
        with torch.no_grad(), hookrun.capture(model, {"h": {"at": "a", "type": "forward", "actions": [action]}}) as cap:
            model(x.to(model_dtype))
        handle.remove()
        got = cap["a", "output"]
        assert got.dtype == torch.bfloat16, (model_dtype, record_dtype, got.dtype)
        assert torch.equal(got, seen[0].to(torch.bfloat16))
