"""A helper run as an nn.Module that is none of the model's (transformers' apply_rotary_pos_emb
when the `kernels` package is installed: a module kept outside the model's tree) is its caller's
own code, as the same helper called as a plain function is: its calls were counted as nobody's,
so `model.layers.0.self_attn/cat.0` named the cache's cat instead of rotary's and `neg` had no
site. References: the tests' own TorchFunctionMode (op_models.OwnCalls) and the helper by hand."""

from __future__ import annotations

import op_models
import torch
from torch import nn

import hookrun


class RotateHalf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., 2:], x[..., :2]), dim=-1)


ROTATE = {"half": RotateHalf()}  # outside any model, as the kernels package keeps its function modules


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return torch.cat((ROTATE["half"](h), h), dim=-1)


def test_calls_inside_a_module_outside_the_model_are_the_callers_in_the_lister_and_a_capture():
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 4)
    with torch.no_grad(), op_models.OwnCalls(model) as ref:
        out = model(x)
    want = ref.first
    assert {"/neg.0", "/cat.0", "/cat.1", "lin/linear.0"} <= set(want)
    ops = {o.name: o for o in hookrun.modules(model, x, ops=True).ops()}
    assert {"/neg.0", "/cat.0", "/cat.1", "lin/linear.0"} <= set(ops) <= set(want)
    for module in ("", "lin"):  # under each module, its own calls in call order
        assert [n for n in ops if n.startswith(f"{module}/")] == [n for n in want if n.startswith(f"{module}/") and n in ops]
    for name, op in ops.items():
        assert op.outputs["output"] == tuple(want[name].shape), name
    hooks = {"o": {"at": ["/neg.0", "/cat.0", "/cat.1"], "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        model(x)
    h = model.lin(x).detach()
    torch.testing.assert_close(cap["/neg.0", "output"], -h[:, 2:])
    torch.testing.assert_close(cap["/cat.0", "output"], torch.cat((-h[:, 2:], h[:, :2]), -1))
    torch.testing.assert_close(cap["/cat.1", "output"], out)
