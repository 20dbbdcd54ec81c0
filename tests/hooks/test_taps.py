"""hooks/taps.py, the forward hooks both the probe and the similarity kinds take their rows with:
each output as a raw forward hook sees it (a tensor, a tuple's first, a ModelOutput's
last_hidden_state), made into rows inside the hook, and one line for a shared module, a module
that gives no tensor and one that does not run; no handle left behind, also after a failure."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

from hookrun.errors import ConfigError
from hookrun.hooks.taps import Taps


class Shapes(nn.Module):
    """Four kinds of output: a tensor changed in place after its hook, a tuple, a ModelOutput whose
    first field is not the hidden state, and a dict."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.pair = Pair()
        self.encoder = Encoder()
        self.named = Named()
        self.spare = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu_(self.conv(x))  # the conv's output rectified in place once its hooks have returned
        a, _ = self.pair(h)
        out = self.encoder(a)
        return self.named(out.last_hidden_state)["value"]


class Pair(nn.Module):
    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return h.flatten(1) * 2.0, h.sum()


class Encoder(nn.Module):
    def forward(self, a: torch.Tensor) -> BaseModelOutputWithPooling:
        return BaseModelOutputWithPooling(pooler_output=None, last_hidden_state=a[:, :6] - 1.0)


class Named(nn.Module):
    def forward(self, h: torch.Tensor) -> dict[str, object]:
        return {"note": "text", "value": h.mean(1, keepdim=True)}


def raw_outputs(model: nn.Module, x: torch.Tensor, picks: dict[str, object]) -> dict[str, torch.Tensor]:
    """The reference: plain forward hooks that clone what `picks` chooses from each output."""
    seen, handles = {}, []
    for name, pick in picks.items():
        handles.append(model.get_submodule(name).register_forward_hook(
            lambda _m, _i, out, name=name, pick=pick: seen.__setitem__(name, pick(out).detach().clone())))
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return seen


def test_each_output_is_the_tensor_a_raw_hook_sees_when_it_fires() -> None:
    model, x = Shapes(), torch.randn(3, 3, 6, 6)
    want = raw_outputs(model, x, {"conv": lambda o: o, "pair": lambda o: o[0],
                                  "encoder": lambda o: o.last_hidden_state, "named": lambda o: o["value"]})
    taps = Taps(model, ["conv", "pair", "encoder", "named"], hook="t", where="t.at")
    with taps.attached(lambda name, t: t.detach().clone()), torch.no_grad():
        model(x)
    got = taps.take()
    assert taps.names == ["conv", "pair", "encoder", "named"]
    for name, rows in zip(taps.names, got, strict=True):
        assert torch.equal(rows, want[name]), name
    assert (got[0] < 0).any()  # the conv's rows as the hook saw them, before the in-place ReLU
    assert not any(m._forward_hooks for m in model.modules())


def test_a_module_with_no_tensor_a_shared_module_and_one_that_does_not_run_are_one_line_each() -> None:
    class Silent(nn.Module):
        def forward(self, x: torch.Tensor) -> str:
            return "no tensor"

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.silent, self.spare = nn.Linear(4, 4), Silent(), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.silent(x)
            return self.lin(self.lin(x))

    model, x = Twice(), torch.randn(2, 4)
    cases = [("lin", "t.at: lin ran twice in one forward (a shared module): which call's output to take is not "
                     "defined; name a module that runs once per forward"),
             ("silent", "t.at: silent gives no tensor (str); name a module whose output is a tensor (python -m "
                        "hookrun.modules lists them)")]
    for name, message in cases:
        taps = Taps(model, [name], hook="t", where="t.at")
        with pytest.raises(ConfigError) as err, taps.attached(lambda _n, t: t.clone()):
            model(x)
        assert str(err.value) == message
        assert not any(m._forward_hooks for m in model.modules())
    taps = Taps(model, ["spare"], hook="t", where="t.at")
    with taps.attached(lambda _n, t: t.clone()):
        model(x)
    with pytest.raises(ConfigError) as err:
        taps.take()
    assert str(err.value) == ("t.at: spare did not run in the model's forward; name a module the forward calls "
                              "(python -m hookrun.modules lists them)")


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
def test_refuse_non_finite_passes_finite_rows_whose_float32_sum_overflows(bad) -> None:
    """The check sums the rows first (one reduction); a sum of large finite values overflows to inf in
    float32, and such rows are finite: they pass. Reference: numpy's isfinite on the same rows."""
    from hookrun.errors import RunError
    from hookrun.hooks.taps import refuse_non_finite

    rows = torch.full((8, 6), 1e37)
    assert not torch.isfinite(rows.sum())
    if bad is not None:
        rows[5, 2] = bad
    items = torch.arange(100, 108)
    finite = np.isfinite(rows.numpy()).all(axis=1)
    if finite.all():
        refuse_non_finite(rows, items, "probe.at: x", "needs finite")
        return
    with pytest.raises(RunError, match=r"x's pooled output holds NaN or infinite values in 1 row\(s\) of this batch "
                                       r"\(the first of item 105\)"):
        refuse_non_finite(rows, items, "probe.at: x", "needs finite")
