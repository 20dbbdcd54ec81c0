"""The evaluate tests' small language-model run: a random-init GPT-2 (seed 0) over eight lines of
text in batches of 3, with an LM loss; and a block whose output is scaled, the intervention they evaluate.

    cfg = lm_cfg(tmp_path, scaled_block(0.5), {"ablation": "zero"})   # a plain dict for hookrun.run
    model = hookrun.models.hf(config=GPT)                             # the model it builds, by hand (seed 0)
"""

from __future__ import annotations

from pathlib import Path

GPT = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 259, "bos_token_id": 1,
       "eos_token_id": 2, "pad_token_id": 0}
LINES = ["a", "The cat sat on the mat.", "hi there", "Tokens, and more tokens, and the rest of a long line here.",
         "x y z", "Padding is left out of every mean.", "ok", "one more line of text"]


def lm_cfg(tmp_path: Path, hooks: dict, evaluate: dict | None, name: str = "run.h5", **over) -> dict:
    text = tmp_path / "lines.txt"
    text.write_text("\n".join(LINES) + "\n")
    cfg = {"model": {"_target_": "hookrun.models.hf", "config": GPT},
           "data": {"dataset": {"_target_": "hookrun.data.text", "files": str(text), "max_length": 16},
                    "batch_size": 3},
           "loss": {"_target_": "hookrun.runner.losses.lm", "_partial_": True},
           "device": "cpu", "progress": False, "hooks": hooks, "evaluate": evaluate,
           "output": {"path": str(tmp_path / name)}}
    cfg.update(over)
    return cfg


def scaled_block(factor: float) -> dict:
    return {"scale": {"at": "transformer.h.0", "type": "forward",
                      "actions": [{"name": "modify_output", "op": "scale", "factor": factor}]}}
