"""Memory-bounded edges (runner/kinds/patching/edges/bounded.py): with a `patching.memory` too small for every
reader's gradient at once, each reader group's gradient is folded into the grid as the backward makes it.

The bounded run is compared with the raw-torch EAP / EAP-IG references of tests/edges/test_edges.py (a
TransformerLens HookedTransformer, gradients read by TransformerLens' own backward hooks, one item at a
time) and tests/edges/test_edges_gqa.py (a Llama-shaped HF model with grouped-query attention, every reader
input its own autograd leaf), and with the unbounded run. Budgets are found from the run's own refusals:
memory=1 is refused before any forward naming the smallest budget for one reader group; that budget is
refused after the clean and corrupted runs naming what one copy's forward needs; that one runs, one
interpolated copy per backward.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import test_edges as lens_ref
import test_edges_gqa as hf_ref
import torch
from tl_models import hooked_transformer

import hookrun
from hookrun.errors import ConfigError
from hookrun.runner.kinds.patching.edges import eap


def lens_items():
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(3):
        c = torch.randint(0, lens_ref.V, (lens_ref.T,), generator=g)
        k = c.clone()
        k[2] = (k[2] + 7) % lens_ref.V
        out.append({"clean": c, "corrupt": k, "answer": int(c[2]), "wrong": int(k[2])})
    return out


@pytest.fixture(scope="module")
def lens():
    return hooked_transformer(lens_ref.V, n_layers=lens_ref.L, d_model=16, n_ctx=8, d_head=4, n_heads=lens_ref.H,
                              act_fn="gelu")


@pytest.fixture
def routes(monkeypatch):
    """The copies per backward of every bounded run (none: the fast route ran)."""
    seen: list = []
    real = eap.streamed_scores

    def spy(*args, **kw):
        seen.append(args[-1])
        return real(*args, **kw)

    monkeypatch.setattr(eap, "streamed_scores", spy)
    return seen


def budget_floor(model, items, **kw) -> int:
    """The smallest budget the run accepts, read from its two refusals."""
    with pytest.raises(ConfigError) as first:
        hookrun.patch_grid(model, items, memory=1, **kw)
    floor = int(re.search(r"give at least (\d+) bytes", str(first.value)).group(1))
    with pytest.raises(ConfigError) as second:
        hookrun.patch_grid(model, items, memory=floor, **kw)
    assert "one copy of the items' forward" in str(second.value)
    return int(re.search(r"give at least (\d+) bytes", str(second.value)).group(1))


@pytest.mark.parametrize("method, m", [("eap", 1), ("eap_ig", 3)])
def test_bounded_equals_raw_torch_and_unbounded(lens, routes, method, m):
    items = lens_items()
    kw = {"input": "input", "method": method, **({"ig_steps": m} if m > 1 else {})}
    fast = hookrun.patch_grid(lens, items, **kw)["edges"]
    assert routes == []
    want, by_position = lens_ref.reference_edges(lens, items, m)
    smallest = budget_floor(lens, items, **kw)
    got = hookrun.patch_grid(lens, items, memory=smallest, **kw)["edges"]
    assert routes == [1]  # m backwards of one copy each, every reader's gradient folded as it came
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(want))
    np.testing.assert_allclose(got.values, want, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(got.attrs["node_scores_by_position"], by_position, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(got.values, fast.values, atol=1e-7, rtol=1e-5)
    np.testing.assert_allclose(got.attrs["node_scores"], fast.attrs["node_scores"], atol=1e-7, rtol=1e-5)


def test_bounded_gqa_and_faithfulness_equal_raw_torch(routes):
    """A Llama-shaped HF model with two key-value heads for four query heads, EAP-IG m = 2, faithfulness on:
    the grid equals the raw-torch reference and the recovered fractions equal the unbounded run's (the
    bounded route's base-run writers are the ones the ablation uses)."""
    net = hf_ref.build("llama", 2)
    g = torch.Generator().manual_seed(1)
    items = []
    for _ in range(3):
        c = torch.randint(0, hf_ref.V, (hf_ref.T,), generator=g)
        k = c.clone()
        k[2] = (k[2] + 7) % hf_ref.V
        items.append({"input_ids": c, "corrupt": k, "answer": int(c[2]), "wrong": int(k[2])})
    kw = {"clean": "input_ids", "method": "eap_ig", "ig_steps": 2, "faithfulness": {"edges": [6, 60]}}
    fast = hookrun.patch_grid(net, items, **kw)["edges"]
    got = hookrun.patch_grid(net, items, memory=budget_floor(net, items, **kw), **kw)["edges"]
    assert routes == [1]
    want = hf_ref.reference_edges(net, items, 2)
    scale = np.nanmax(np.abs(want))
    np.testing.assert_allclose(got.values, want, atol=1e-5 * scale, rtol=1e-4)
    np.testing.assert_allclose(got.values, fast.values, atol=1e-7 * scale, rtol=1e-5)
    np.testing.assert_allclose(got.attrs["faithfulness_recovered"], fast.attrs["faithfulness_recovered"], atol=1e-6)


def test_a_budget_below_one_reader_group_is_one_line_before_any_forward(lens):
    calls = []
    handle = lens.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ConfigError) as err:
            hookrun.patch_grid(lens, lens_items(), input="input", method="eap", memory="10KB")
    finally:
        handle.remove()
    text = str(err.value)
    assert calls == [] and "\n" not in text
    assert "patching.memory=10000 bytes" in text and "one reader group" in text
    # the floor: both inputs' writer contributions, their float64 differences, one reader group's float64 gradient
    # twice and its sum over the group's readers
    n, t, d, writers, heads = 3, lens_ref.T, 16, 1 + lens_ref.L * (lens_ref.H + 1), lens_ref.H
    floor = 2 * writers * n * t * d * 4 + writers * n * t * d * 8 + (2 * heads + 1) * n * t * d * 8
    assert f"give at least {floor} bytes" in text
