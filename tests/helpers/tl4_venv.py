"""TransformerLens 4.3 in its own venv (tests/envs/make_tl4.sh; its python is $HOOKRUN_TL4_PYTHON), and
the model both sides of a TL4 test load: a random-init HF GPT-2 over a word-level vocabulary, saved.

    pytestmark = [pytest.mark.slow, needs_tl4]
    model = saved_word_gpt2(folder)                                   # weights and tokenizer in folder
    run_tl4("tl4_edges.py", folder, folder / "spec.json", folder / "tl.npz")   # tests/envs/SCRIPT there
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

TL4 = os.environ.get("HOOKRUN_TL4_PYTHON", "/opt/tl4/bin/python")
ENVS = Path(__file__).resolve().parents[1] / "envs"
needs_tl4 = pytest.mark.skipif(not Path(TL4).exists(), reason=f"no TransformerLens 4.3 venv at {TL4} "
                               f"(bash tests/envs/make_tl4.sh DIR; HOOKRUN_TL4_PYTHON=DIR/bin/python)")


def saved_word_gpt2(folder: Path) -> torch.nn.Module:
    """A 2-layer GPT-2 (seed 0, eager attention) over 48 words w0..w45, <unk>, <|endoftext|>, saved with
    its tokenizer in `folder`; the model, in eval mode."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(46)] + ["<unk>", "<|endoftext|>"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|endoftext|>").save_pretrained(folder)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=48, n_positions=16, n_embd=32, n_layer=2, n_head=4, bos_token_id=47, eos_token_id=47)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").eval()
    model.save_pretrained(folder)
    return model


def run_tl4(script: str, *args: object, hookrun: bool = False) -> None:
    """tests/envs/SCRIPT ARGS under the venv's python, offline; without this checkout on its path, or with it
    (`hookrun`: a script that runs hookrun in the venv, on one thread)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    if hookrun:
        env |= {"PYTHONPATH": str(ENVS.parents[1]), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([TL4, str(ENVS / script), *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
