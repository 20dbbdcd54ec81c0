"""hookrun.run(mode=grad) called under a notebook's torch.no_grad() or torch.inference_mode() takes its
gradients as outside them: under no_grad it said 'loss: CrossEntropyLoss(output, target) returned a
tensor that does not require grad ... no .detach(), .item()' (the caller's mode, not the loss), and
under inference_mode too. Reference: torch.autograd.grad of the same loss on the same batch."""

from __future__ import annotations

import contextlib

import pytest
import torch

import hookrun

N, B = 8, 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).eval()


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode, contextlib.nullcontext])
def test_a_grad_run_under_the_callers_no_grad_or_inference_mode_takes_the_gradients(tmp_path, mode):
    model = _model()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 5, generator=g), torch.randint(0, 3, (N,), generator=g)
    cfg = {"mode": "grad", "loss": {"_target_": "torch.nn.CrossEntropyLoss"}, "data": {"batch_size": B},
           "hooks": {"g": {"at": "0", "type": "tensor"}}, "progress": False,
           "output": {"path": str(tmp_path / "g.h5")}}
    with mode():
        result = hookrun.run(cfg, model=model, dataset=[(x[i], y[i]) for i in range(N)])
    assert result.status == "complete"
    ref, out = [], []
    h = model[0].register_forward_hook(lambda m, a, o: out.append(o))
    for s in range(0, N, B):
        loss = torch.nn.functional.cross_entropy(model(x[s:s + B]), y[s:s + B])
        ref.append(torch.autograd.grad(loss, out[-1])[0])
    h.remove()
    got = hookrun.open_run(result.path)["0", "grad"][:]
    torch.testing.assert_close(torch.from_numpy(got), torch.cat(ref), rtol=1e-6, atol=1e-9)
    assert all(p.grad is None for p in model.parameters())
