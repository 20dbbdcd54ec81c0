"""The logit lens on a TransformerLens 4.3 TransformerBridge of a Gemma 2 whose forward softcaps its logits:
the final distribution is the bridge's own output and each layer's logits take the same softcap, as on the
HF model itself. hookrun runs in the TL 4.3 venv (tests/envs/tl4_lens_bridge.py); the references are the
bridge's returned logits and block 0's lens from the HF model's own modules (a raw hook, model.norm, lm_head,
tanh(z / c) * c). The bridge's own ln_final (a wrapper) is refused as `norm` in one line whose hint names
the norm inside it first and no module that the same check refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tl4_venv import needs_tl4, run_tl4

pytestmark = [pytest.mark.slow, needs_tl4]


def test_a_bridge_of_a_softcapped_gemma2_has_the_models_own_final_distribution(tmp_path):
    run_tl4("tl4_lens_bridge.py", tmp_path, tmp_path / "l.npz", hookrun=True)
    got = np.load(tmp_path / "l.npz")
    final = torch.log_softmax(torch.from_numpy(got["output"]), -1)
    lp0 = torch.log_softmax(torch.from_numpy(got["layer0"]), -1)
    want_last = final.sort(-1, descending=True).values.numpy()
    np.testing.assert_allclose(got["top_logprobs.1"], want_last, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["kl_to_final.1"], 0, atol=1e-4)
    np.testing.assert_allclose(got["top_logprobs.0"], lp0.sort(-1, descending=True).values.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["kl_to_final.0"], (final.exp() * (final - lp0)).sum(-1).numpy(), rtol=1e-4, atol=1e-4)
    msg = str(got["refused"])
    assert "norm='ln_final' is a RMSNormalizationBridge, not a norm" in msg and "\n" not in msg, msg
    hint = msg.split("e.g. ")[1].split(", ")
    assert hint[0] == "ln_final._original_component" and all(h.endswith("._original_component") for h in hint), hint
