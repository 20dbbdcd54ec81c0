"""hookrun.patch_grid with method atp called under a notebook's torch.inference_mode() gives the grid
it gives outside it (it failed with torch's 'RuntimeError: element 0 of tensors does not require grad
and does not have a grad_fn'). Reference: the estimate by torch.autograd.grad through raw
TransformerLens hooks (test_patching.raw_atp), made outside inference mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun

pytest.importorskip("transformer_lens")
from patch_tasks import token_task  # noqa: E402
from test_patching import HEADS, V, raw_atp, tl_metric  # noqa: E402
from tl_models import hooked_transformer  # noqa: E402


def test_atp_under_inference_mode_equals_the_autograd_estimate():
    model = hooked_transformer(V, d_model=32, n_ctx=16, d_head=8, act_fn="gelu")
    clean, corrupt, ans, wrong, items = token_task(V, 3, 6, at=2)
    m0, terms = raw_atp(model, clean, corrupt, tl_metric(ans, wrong), "attn.hook_z")
    ref = np.stack([(m0 + terms[f"blocks.{layer}.attn.hook_z"].sum(dim=(0, 3))).detach().numpy() for layer in range(2)])
    with torch.inference_mode():
        g = hookrun.patch_grid(model, items, input="input", method="atp", sites={"heads": HEADS})["heads"]
    np.testing.assert_allclose(g.values, ref, atol=1e-4)
    assert all(p.grad is None for p in model.parameters())
