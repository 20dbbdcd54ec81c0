"""A circuit scored by TransformerLens 4.3 (`attribution_patch(granularity="edge")`, its edge scores saved as
JSON records) imported by `faithfulness.from`: hookrun's recovered fractions of its top-k circuits equal
TransformerLens' own `faithfulness` of the same circuits, on the same random-init HF GPT-2 (hookrun on the HF
model, TransformerLens on a TransformerBridge of it, in its own venv: see tests/edges/test_edges_tl4.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

TL4 = os.environ.get("HOOKRUN_TL4_PYTHON", "/opt/tl4/bin/python")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path(TL4).exists(), reason=f"no TransformerLens 4.3 venv at {TL4}")]
SCRIPT = Path(__file__).resolve().parents[1] / "envs" / "tl4_edge_scores.py"
KS = [0, 5, 40, 110]


def test_transformer_lens_circuit_scored_as_transformer_lens_scores_it(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(46)] + ["<unk>", "<|endoftext|>"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|endoftext|>").save_pretrained(tmp_path)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=48, n_positions=16, n_embd=32, n_layer=2, n_head=4, bos_token_id=47, eos_token_id=47)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").eval()
    model.save_pretrained(tmp_path)
    spec = {"clean": [[1, 2, 3, 4, 5, 6]], "corrupt": [[1, 2, 30, 4, 5, 6]], "answer": 3, "wrong": 30, "ks": KS}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run([TL4, str(SCRIPT), str(tmp_path), str(tmp_path / "spec.json"), str(tmp_path / "tl.json")],
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    tl = json.loads((tmp_path / "tl.json").read_text())
    items = [{"input_ids": torch.tensor(spec["clean"][0]), "corrupt": torch.tensor(spec["corrupt"][0]), "answer": 3, "wrong": 30}]
    got = hookrun.patch_grid(model, items, clean="input_ids", method="eap",
                             faithfulness={"edges": KS, "from": str(tmp_path / "tl.json")})["edges"]
    np.testing.assert_allclose(got.attrs["faithfulness_recovered"], tl["recovered"], atol=1e-4, rtol=0)

    tl["edge_scores"] = [r for r in tl["edge_scores"] if not (r["writer"]["kind"] == "mlp_out" and r["reader"]["kind"] == "logits")]
    (tmp_path / "part.json").write_text(json.dumps(tl))
    with pytest.raises(ConfigError, match=r"edge L\d.MLP -> logits is missing"):
        hookrun.patch_grid(model, items, clean="input_ids", method="eap", faithfulness={"edges": KS, "from": str(tmp_path / "part.json")})
