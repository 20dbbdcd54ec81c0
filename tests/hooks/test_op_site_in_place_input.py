"""replace_input at an in-place op site whose result the model drops (`x.mul_(3)` as a statement, the
model going on with x): the replacement is written into the tensor the op changes, so the op runs on
the edited input and the model sees the result, as the same function written out by hand does (before,
the op changed a copy: both the edit and the op were lost). The gradient reaches the input through it."""

from __future__ import annotations

import torch
from torch import nn

import hookrun


class Triple(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(3.0)
        return x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.s, self.head = nn.Linear(4, 4), Triple(), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.s(self.lin(x)))


HOOKS = {"e": {"at": "s/mul_", "type": "forward_pre",
               "actions": [{"name": "replace_input", "op": "scale", "factor": 0.5, "arg": 0}]}}


def test_the_op_runs_on_the_edited_input_and_the_model_sees_it():
    model, x = Net().eval(), torch.randn(3, 4)
    with torch.no_grad(), hookrun.capture(model, HOOKS):
        got = model(x)
    with torch.no_grad():
        want = model.head(model.lin(x) * 0.5 * 3.0)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_gradient_goes_through_the_edit():
    model, x = Net().eval(), torch.randn(3, 4)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with hookrun.capture(model, HOOKS):
        model(a).sum().backward()
    (want,) = torch.autograd.grad(model.head(model.lin(b) * 1.5).sum(), b)
    torch.testing.assert_close(a.grad, want, rtol=0, atol=1e-6)
