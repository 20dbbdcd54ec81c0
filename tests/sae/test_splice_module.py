"""op: splice refuses an SAE at a module other than the one it was trained on (its cfg.json hook_name)
unless other_module: true; with it, the logits equal a raw forward hook on that other module returning
the SAE's reconstruction (test_splice.py's SAE and reference functions)."""

from __future__ import annotations

import pytest
import torch
from test_splice import BLOCK, data, decode, encode, gpt2, run, sae, splice_hooks, stored_logits  # noqa: F401

from hookrun.errors import ConfigError

OTHER = "transformer.h.1"


def at_other(folder, **extra):
    hooks = splice_hooks(folder, **extra)
    hooks["sae"]["at"] = OTHER
    return hooks


def test_an_sae_at_another_module_than_its_own_is_one_line_naming_both(tmp_path, data, sae):  # noqa: F811
    folder, _ = sae
    model = gpt2()
    with pytest.raises(ConfigError) as info:
        run(tmp_path, model, data, at_other(folder))
    msg = str(info.value)
    assert "\n" not in msg and f"trained on {BLOCK}" in msg and f"not {OTHER}" in msg and "other_module: true" in msg
    assert not (tmp_path / "c.h5").exists() and "sae" not in model.transformer.h[1]._modules


def test_other_module_true_splices_it_there(tmp_path, data, sae):  # noqa: F811
    folder, w = sae
    model = gpt2()
    handle = model.transformer.h[1].register_forward_hook(lambda m, a, o: decode(w, encode(w, o)))
    try:
        with torch.no_grad():
            ref = torch.cat([model(input_ids=data.encoded["input_ids"][i:i + 4],
                                   attention_mask=data.encoded["attention_mask"][i:i + 4]).logits
                             for i in range(0, len(data), 4)])
    finally:
        handle.remove()
    with run(tmp_path, model, data, at_other(folder, other_module=True)) as f:
        got = stored_logits(f)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
