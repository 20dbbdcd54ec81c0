"""mode=grad's class-index losses (cross_entropy, target_logit) on targets that are not class indices
of the logits: a class past the last, a float target with fractions (truncated by .long() before), a
(batch, tokens, vocab) output for target_logit. References: F.cross_entropy's own refusal, and
torch.autograd.grad of the same loss with integer targets."""

from __future__ import annotations

import h5py
import pytest
import torch
import torch.nn.functional as F

import hookrun
from hookrun.errors import RunError

HOOKS = {"t": {"at": "", "type": "tensor", "actions": ["record"]}}


def cfg(tmp_path, loss: str) -> dict:
    return {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "hooks": HOOKS, "mode": "grad",
            "loss": {"_target_": f"hookrun.runner.losses.{loss}", "_partial_": True},
            "output": {"path": str(tmp_path / "c.h5")}}


def data(targets) -> torch.utils.data.TensorDataset:
    torch.manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(len(targets), 6), torch.tensor(targets))


def test_torch_itself_refuses_a_class_past_the_last():
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        F.cross_entropy(torch.randn(2, 5), torch.tensor([1, 9]))


@pytest.mark.parametrize("loss", ["cross_entropy", "target_logit"])
def test_a_class_past_the_last_is_one_line(tmp_path, loss):
    """It was torch's IndexError (cross_entropy) or RuntimeError (target_logit), with a traceback."""
    with pytest.raises(RunError) as err:
        hookrun.run(cfg(tmp_path, loss), model=torch.nn.Linear(6, 5), dataset=data([0, 1, 2, 3, 4, 9, 1, 2]))
    assert str(err.value) == (f"loss={loss}: target 9 is not a class of logits of shape (4, 5): class indices run 0 to "
                              f"4 (dim 1)")


@pytest.mark.parametrize("loss", ["cross_entropy", "target_logit"])
def test_float_targets_with_fractions_are_refused_not_truncated(tmp_path, loss):
    """[0.7, 2.5, ...] became [0, 2, ...] and the run ended complete."""
    with pytest.raises(RunError) as err:
        hookrun.run(cfg(tmp_path, loss), model=torch.nn.Linear(6, 5), dataset=data([0.7, 2.5, 1.0, 3.0]))
    assert str(err.value) == (f"loss={loss}: the targets are class indices, and the batch's are torch.float32 with "
                              f"fractions (0.7); give integer class indices, or loss=custom for another kind of target")


@pytest.mark.parametrize("loss", ["cross_entropy", "target_logit"])
def test_whole_float_targets_give_autograds_gradient(tmp_path, loss):
    torch.manual_seed(1)
    model, ds = torch.nn.Linear(6, 5), data([0.0, 4.0, 2.0, 3.0])
    path = hookrun.run(cfg(tmp_path, loss), model=model, dataset=ds).path
    x, y = ds.tensors
    out = model(x)
    value = F.cross_entropy(out, y.long()) if loss == "cross_entropy" else out.gather(1, y.long()[:, None]).sum()
    with h5py.File(path) as f:
        torch.testing.assert_close(torch.from_numpy(f["captures/t/__model__/grad"][:]), torch.autograd.grad(value, out)[0])


def test_target_logit_on_token_logits_is_one_line(tmp_path):
    class Tok(torch.nn.Module):
        def forward(self, x):
            return x[:, :, None].expand(-1, -1, 5)

    with pytest.raises(RunError, match=r"^loss=target_logit: logits of shape \(4, 6, 5\) do not fit targets of shape "
                                       r"\(4,\) \(batch, classes logits, one class index per sample\)"):
        hookrun.run(cfg(tmp_path, "target_logit"), model=Tok(), dataset=data([0, 1, 2, 3]))


def detached(output, target):
    return output.sum().detach()


def constant(output, target):
    return torch.tensor(3.0)


def per_sample(output, target):
    return output.sum(1)


def twice(output, target):
    loss = output.sum()
    loss.backward(retain_graph=False)  # a loss that runs its own backward: hookrun's then fails in torch
    return loss


@pytest.mark.parametrize("fn, said", [
    (detached, "detached(output, target) returned a tensor that does not require grad, so no gradient can reach a hook"),
    (constant, "constant(output, target) returned a tensor that does not require grad, so no gradient can reach a hook"),
    (per_sample, r"per_sample(output, target) returned a tensor of shape (4,); mode=grad needs a scalar tensor"),
    (twice, "twice(output, target): its backward() raised RuntimeError: Trying to backward through the graph a second "
            "time"),
])
def test_a_user_loss_that_no_gradient_can_come_from_is_one_line_naming_it(tmp_path, fn, said):
    """A detached or constant loss was torch's traceback ('element 0 of tensors does not require grad'), as a
    second backward() was; a per-sample loss said 'expected a scalar tensor, got Tensor torch.Size([4])', naming
    no loss. The reference for 'requires no grad': torch.autograd.grad refuses the same loss."""
    model, x = torch.nn.Linear(6, 5), torch.randn(4, 6, requires_grad=True)
    if fn in (detached, constant):
        with pytest.raises(RuntimeError, match="does not require grad"):
            torch.autograd.grad(fn(model(x), None), x)
    c = {**cfg(tmp_path, "cross_entropy"), "loss": {"_target_": f"{__name__}.{fn.__name__}", "_partial_": True}}
    with pytest.raises(RunError) as err:
        hookrun.run(c, model=model, dataset=data([0, 1, 2, 3]))
    assert str(err.value).startswith(f"loss: {said}"), str(err.value)
    with h5py.File(tmp_path / "c.h5") as f:
        assert f.attrs["status"] == "failed"
