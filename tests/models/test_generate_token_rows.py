"""mode=generate with `record rows: token` and no `what:`: the block's output rows against a raw
forward hook during Hugging Face generate, on the same weights and prompts."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from toy_lm import EOS, PAD, Prompts, tiny_gpt2

import hookrun
from hookrun.errors import RunError
from hookrun.store.records import Capture, CaptureKey, StepCaptures

pytest.importorskip("transformers")

N_NEW, BATCH = 4, 4


@pytest.fixture(scope="module")
def reference() -> dict:
    """{(sample, position): block 0's output row} from a raw hook on plain model.generate."""
    model, ds, rows = tiny_gpt2(), Prompts(), {}
    calls: list[torch.Tensor] = []
    model.transformer.h[0].register_forward_hook(lambda m, a, o: calls.append((o[0] if isinstance(o, tuple) else o).clone()))
    for start in range(0, len(ds), BATCH):
        batch = default_collate([ds[i] for i in range(start, min(start + BATCH, len(ds)))])
        calls.clear()
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=N_NEW, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
        mask, new = batch["attention_mask"].bool(), out[:, batch["input_ids"].shape[1]:]
        for b in range(len(mask)):
            real = mask[b].nonzero().flatten().tolist()
            rows.update({(start + b, p): calls[0][b, j] for p, j in enumerate(real)})
            for k in range(1, len(calls)):  # call k reads new token k-1, while no EOS came before it
                if EOS in new[b, :k].tolist():
                    break
                rows[start + b, len(real) + k - 1] = calls[k][b, 0]
    return rows


def test_token_rows_without_what_record_the_output_as_a_raw_hook(tmp_path, reference, caplog):
    cfg = {"model": {"_target_": "toy_lm.tiny_gpt2"},
           "data": {"dataset": {"_target_": "toy_lm.Prompts"}, "batch_size": BATCH},
           "mode": "generate", "generate": {"max_new_tokens": N_NEW, "do_sample": False}, "device": "cpu",
           "progress": False, "output": {"path": str(tmp_path / "c.h5")},
           "hooks": {"r": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "rows": "token"}]}}}
    with h5py.File(hookrun.run(cfg).path, "r") as f:
        group = f["captures/r/transformer.h.0"]
        got, roles = group["output"][:], set(group)
        keys = list(zip(f["samples/token_sample"][:].tolist(), f["samples/token_position"][:].tolist(), strict=True))
    assert sorted(keys) == sorted(reference) and "output" in roles
    assert not any(r.startswith("input.2") for r in roles)  # the 4-D attention mask: not one per token
    assert "input.2" in caplog.text  # left out with the usual warning
    np.testing.assert_allclose(got, torch.stack([reference[k] for k in keys]).numpy(), rtol=0, atol=1e-6)


def test_token_rows_whose_shape_changes_between_model_calls_are_refused_in_one_line():
    step, key = StepCaptures(), CaptureKey("r", "transformer.h.0", "forward", "input.2")
    step.add(Capture(key, torch.zeros(4, 1, 8), False, tokens=True))
    with pytest.raises(RunError, match=r"input.2 has rows of shape \(1, 9\) at a new token's model call, \(1, 8\) before"):
        step.add(Capture(key, torch.zeros(4, 1, 9), False, tokens=True))
