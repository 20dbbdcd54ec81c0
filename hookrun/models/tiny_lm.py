"""The small GPT-2 shipped with hookrun, trained on English text (model=tiny_lm), read offline.

    model = tiny_lm()                      # GPT2LMHeadModel, 4 blocks of 128, byte tokens, float32
    model = tiny_lm(attn_implementation="sdpa")

Its weights live in the package (hookrun/models/tiny_lm/: config.json, model.safetensors and
training.json, the record of the run that made them). It reads the ids of data=text's byte
tokenizer (pad 0, bos 1, eos 2, byte b -> b + 3) and was trained on the Python reference's prose
(pydoc_data.topics); examples/train_tiny_lm.py retrains it.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from hookrun.errors import ConfigError
from hookrun.models.hf import hf

FOLDER = Path(__file__).with_name("tiny_lm")


def tiny_lm(attn_implementation: str | None = "eager") -> nn.Module:
    """The shipped model, in float32, from the package folder; nothing is downloaded."""
    if not (FOLDER / "model.safetensors").is_file():
        raise ConfigError(f"model=tiny_lm: no weights at {str(FOLDER)!r}; reinstall hookrun, or write them "
                          f"with python examples/train_tiny_lm.py")
    return hf(model_class="GPT2LMHeadModel", path=str(FOLDER),
              attn_implementation=attn_implementation).float()
