"""hookrun's EAP edges and faithfulness equal TransformerLens 4.3's `attribution_patch(granularity="edge")`
and `faithfulness` to 1e-4 on the same random-init HF GPT-2 (hookrun on the HF model itself, TransformerLens
on a TransformerBridge of it).

TransformerLens 4.3 cannot live beside 3.9 (which the other tests need): it is in a venv of its own,
made by `bash tests/envs/make_tl4.sh DIR`, whose python is named by $HOOKRUN_TL4_PYTHON (default
/opt/tl4/bin/python). The reference script tests/envs/tl4_edges.py runs there on the saved model and
a local word-level tokenizer and writes its scores to an .npz. Skipped only where that venv is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import hookrun

TL4 = os.environ.get("HOOKRUN_TL4_PYTHON", "/opt/tl4/bin/python")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path(TL4).exists(), reason=f"no TransformerLens 4.3 venv at {TL4} "
                                                   f"(bash tests/envs/make_tl4.sh DIR; HOOKRUN_TL4_PYTHON=DIR/bin/python)")]
SCRIPT = Path(__file__).resolve().parents[1] / "envs" / "tl4_edges.py"
KS = [0, 5, 40, 110]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("gpt2")
    words = [f"w{i}" for i in range(46)] + ["<unk>", "<|endoftext|>"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|endoftext|>").save_pretrained(d)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=48, n_positions=16, n_embd=32, n_layer=2, n_head=4, bos_token_id=47, eos_token_id=47)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").eval()
    model.save_pretrained(d)
    spec = {"clean": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]],
            "corrupt": [[1, 2, 30, 4, 5, 6], [7, 8, 31, 10, 11, 12], [13, 14, 32, 16, 17, 18]],
            "answer": 3, "wrong": 30, "ks": KS}
    (d / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    run = subprocess.run([TL4, str(SCRIPT), str(d), str(d / "spec.json"), str(d / "tl.npz")], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    items = [{"input_ids": torch.tensor(c), "corrupt": torch.tensor(k), "answer": 3, "wrong": 30}
             for c, k in zip(spec["clean"], spec["corrupt"], strict=True)]
    return model, items, np.load(d / "tl.npz")


def test_eap_edges_equal_transformer_lens_4(saved):
    model, items, tl = saved
    got = hookrun.patch_grid(model, items, clean="input_ids", method="eap")["edges"]
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(tl["grid"]))
    np.testing.assert_allclose(got.values, tl["grid"], atol=1e-4, rtol=0)
    assert int(tl["n_edges"]) == int(np.isfinite(got.values).sum()) * 6  # TransformerLens' edges are per position


def test_faithfulness_equals_transformer_lens_4(saved):
    model, items, tl = saved
    got = hookrun.patch_grid(model, items[:1], clean="input_ids", method="eap", faithfulness={"edges": KS})["edges"]
    np.testing.assert_allclose(got.attrs["faithfulness_recovered"], tl["recovered"], atol=1e-4, rtol=0)
