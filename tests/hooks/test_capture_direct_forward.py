"""hookrun.capture around TransformerLens' run_with_hooks, which calls model.forward(...) directly (no
module hook of the model runs): each call is a step of the block, as model(...) is. Before, no step
began: a warning said the hooked module 'ran outside a call of the model', two calls gave captures
'output' (1, 2, 8, 32) and 'output@1' (1, 3, 8, 32). Reference: TransformerLens' own hook on the same
point in the same run_with_hooks call. The model's forward is its class's again after the block."""

from __future__ import annotations

import pytest
import torch

import hookrun

pytest.importorskip("transformer_lens")
from tl_models import hooked_transformer  # noqa: E402


def _zero(act, hook):
    return act * 0


def test_run_with_hooks_inside_a_capture_is_one_step_per_call_with_transformer_lens_values():
    model = hooked_transformer(40, n_ctx=12, d_model=32)
    toks = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(0))
    ref = []
    for k in (2, 3):
        model.run_with_hooks(toks[:k], fwd_hooks=[("blocks.0.hook_attn_out", _zero),
                                                  ("blocks.1.hook_resid_post", lambda a, hook: ref.append(a.clone()))])
    hooks = {"f": {"at": "blocks.1.hook_resid_post", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        for k in (2, 3):
            model.run_with_hooks(toks[:k], fwd_hooks=[("blocks.0.hook_attn_out", _zero)])
        model(toks)  # and a call as model(...) after them
    _, cache = model.run_with_cache(toks)
    assert cap.steps == 3 and list(cap) == [("f", "blocks.1.hook_resid_post", "output")]
    torch.testing.assert_close(cap["blocks.1.hook_resid_post", "output"],
                               torch.cat([*ref, cache["blocks.1.hook_resid_post"]]), rtol=0, atol=0)
    assert "forward" not in model.__dict__
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0
