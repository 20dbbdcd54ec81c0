"""A metric of the user's own whose value has no gradient (an argmax accuracy, a .detach()) under a gradient method
(eap, eap_ig, atp, atp_ig): one ConfigError line after the base runs, before any forward with gradients (it ended in
torch's 'element 0 of tensors does not require grad' traceback in the gradient pass). torch itself is the reference
for "no gradient": torch.autograd.grad of the metric on the model's own logits raises. A differentiable metric of the
user's own still runs: its eap grid equals the raw-torch EAP of tests/edges/test_edges_gqa.py on the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_edges_gqa as G
import torch
from edge_graph import prompt_pairs

import hookrun
from hookrun.errors import ConfigError, RunError


def accuracy(logits, items):
    return (logits[:, -1].argmax(-1) == items["answer"]).float()


def detached(logits, items):
    return (logits[:, -1].gather(-1, items["answer"][:, None]) - logits[:, -1].gather(-1, items["wrong"][:, None]))[:, 0].detach()


def logit_diff(logits, items):
    return (logits[:, -1].gather(-1, items["answer"][:, None]) - logits[:, -1].gather(-1, items["wrong"][:, None]))[:, 0]


@pytest.fixture(scope="module")
def net():
    return G.build("llama", 2)


@pytest.fixture(scope="module")
def items():
    return prompt_pairs(G.V, G.T, seed=1, at=2, shift=7, clean="input_ids")


@pytest.mark.parametrize("fn", [accuracy, detached])
@pytest.mark.parametrize("method", ["eap", "eap_ig", "atp", "atp_ig"])
def test_a_metric_without_a_gradient_is_one_line_before_the_gradient_pass(net, items, fn, method):
    ids = torch.stack([it["input_ids"] for it in items])
    batch = {k: torch.tensor([it[k] for it in items]) for k in ("answer", "wrong")}
    logits = net(ids).logits
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(fn(logits, batch).mean(), logits)  # (torch: the value has no gradient to take)
    grad_forwards = []
    handle = net.register_forward_pre_hook(lambda m, a: grad_forwards.append(1) if torch.is_grad_enabled() else None)
    sites = {"sites": {"mlp": {"at": "model.layers.*.mlp", "over": ["position"]}}} if method.startswith("atp") else {}
    try:
        with pytest.raises(ConfigError) as info:
            hookrun.patch_grid(net, items, clean="input_ids", method=method, metric=fn, **sites)
    finally:
        handle.remove()
    msg = str(info.value)
    assert grad_forwards == [] and "\n" not in msg, msg
    assert msg.startswith(f"patching.metric {fn.__name__}: "), msg
    assert "no gradient" in msg and f"method={method}" in msg, msg


def test_a_differentiable_metric_of_the_users_own_equals_raw_torch(net, items):
    got = hookrun.patch_grid(net, items, clean="input_ids", method="eap", metric=logit_diff)["edges"]
    want = G.reference_edges(net, items, 1)
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(want))
    np.testing.assert_allclose(got.values, want, atol=1e-5 * np.nanmax(np.abs(want)), rtol=1e-4)


def sqrt_at_zero(logits, items):
    x = logits[:, -1, 0]
    return logit_diff(logits, items) + torch.sqrt(x - x.detach())  # (its value is the logit difference; its gradient inf)


def test_a_metric_whose_gradient_is_not_finite_fails_in_one_line_and_leaves_no_file(net, items, tmp_path):
    """Every score was NaN (shown as cells with no edge), faithfulness ranked zeros (CPR 0.25) and the run said complete."""
    ids = torch.stack([it["input_ids"] for it in items])
    batch = {k: torch.tensor([it[k] for it in items]) for k in ("answer", "wrong")}
    logits = net(ids).logits
    (grad,) = torch.autograd.grad(sqrt_at_zero(logits, batch).mean(), logits)  # torch: the gradient is not finite
    assert not bool(torch.isfinite(grad).all())
    with pytest.raises(RunError) as info:
        hookrun.patch_grid(net, items, clean="input_ids", method="eap", metric=sqrt_at_zero,
                           faithfulness={"edges": [5], "fractions": "mib"})
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("patching.metric sqrt_at_zero: its gradient is not finite") and "-> " in msg, msg
    path = tmp_path / "run.h5"
    with pytest.raises(RunError):
        hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path)},
                     "patching": {"method": "eap_ig", "ig_steps": 2, "clean": "input_ids",
                                  "metric": {"_target_": f"{__name__}.sqrt_at_zero"}}},
                    model=net, dataset=items)
    assert not path.exists()
