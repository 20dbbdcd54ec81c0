"""evaluate's splice statistics at a module that runs twice in one forward (a looped block): the SAE is
spliced at each call (the logits are those of a raw hook returning the reconstruction at every call), and
l0, mse and explained_variance pool both calls' rows, as docs/evaluate.md says. Reference: the
reconstruction and the statistics' definitions by hand in float64 on the same weights and rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from toy_models import standard_sae

import hookrun

safetensors = pytest.importorskip("safetensors.torch")
V, D, D_SAE = 32, 8, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class Looped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.blk, self.head = nn.Embedding(V, D), Block(), nn.Linear(D, V)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blk(self.blk(self.emb(input_ids))))


def test_a_splice_at_a_module_called_twice_acts_at_both_calls_and_pools_their_rows(tmp_path):
    w = standard_sae(tmp_path, D, D_SAE, "blk")
    g = torch.Generator().manual_seed(2)  # the items (the reference below reads the same ones)
    items = [{"input_ids": torch.randint(0, V, (5,), generator=g)} for _ in range(8)]
    model = Looped().eval()
    cfg = {"data": {"batch_size": 4}, "progress": False, "output": {"path": str(tmp_path / "e.h5")},
           "loss": {"_target_": "hookrun.runner.losses.lm", "_partial_": True}, "evaluate": {"enabled": True},
           "hooks": {"s": {"at": "blk", "type": "forward", "actions": [
               {"name": "modify_output", "op": "splice", "path": str(tmp_path)}]},
                     "l": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}}
    result = hookrun.run(cfg, model=model, dataset=items)
    with hookrun.open_run(result.path) as run:
        got = run.evaluation().to_pandas().iloc[0]
        logits = torch.as_tensor(run["head", "output"][:])

    def encode(x):
        return torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])

    with torch.no_grad():
        h, xs, fs = model.emb(torch.stack([it["input_ids"] for it in items])), [], []
        for _ in range(2):
            x = model.blk(h)
            f = encode(x)
            h = f @ w["W_dec"] + w["b_dec"]
            xs.append(x.reshape(-1, D).double())
            fs.append(f.reshape(-1, D_SAE))
        torch.testing.assert_close(logits, model.head(h), rtol=1e-5, atol=1e-5)
    x, f = torch.cat(xs), torch.cat(fs)  # both calls' rows, pooled
    err = ((x - (f.double() @ w["W_dec"].double() + w["b_dec"].double())) ** 2).sum()
    var = (x ** 2).sum() / len(x) - ((x.sum(0) / len(x)) ** 2).sum()
    assert got["l0"] == pytest.approx(float((f > 0).sum()) / len(x), rel=1e-6)
    assert got["mse"] == pytest.approx(float(err) / x.numel(), rel=1e-5)
    assert got["explained_variance"] == pytest.approx(1 - float(err) / len(x) / float(var), rel=1e-5)
