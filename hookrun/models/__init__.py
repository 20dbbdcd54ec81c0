"""Model builders named by `_target_` in conf/model/: transformers and timm models, offline.

    model = hf(model_class="GPT2LMHeadModel", config={"n_layer": 2})   # random init, no download
    model = timm_model("vit_tiny_patch16_224", img_size=32)
    model = tiny_lm()   # the small GPT-2 shipped with hookrun, trained on English text
    model = tiny_cnn()  # the small CNN shipped with hookrun, trained on generated shapes

Each builder's module is imported when the builder is first named (hookrun/lazy.py): a run of a
torchvision model loads none of them. `loading_bars(progress)`, which build_model enters around
every model, says whether a builder shows its library's weight-loading bar (hf's: transformers').
`weights_digest(model)` names a model's weights in a few bytes (the file's `model_fingerprint`).
"""

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from hookrun.lazy import lazy_names

__all__ = ["hf", "loading_bars", "timm_model", "tiny_cnn", "tiny_lm", "weights_digest"]
BARS: ContextVar[bool] = ContextVar("hookrun_loading_bars", default=True)  # progress=false: no loading bar


@contextmanager
def loading_bars(on: bool) -> Iterator[None]:
    """Within it, models built by hf() show transformers' weight-loading bar only when `on` (the
    run's `progress`); build_model enters it."""
    token = BARS.set(bool(on))
    try:
        yield
    finally:
        BARS.reset(token)


lazy_names(__name__, {"hf": "hf", "timm_model": "vision", "tiny_cnn": "tiny_cnn", "tiny_lm": "tiny_lm"})


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of the model's parameters and buffers, by name, dtype, shape and their first and last four
    values: two builds of a random-init model under other seeds differ, the same weights agree. It reads
    eight values a tensor, not the weights. '' where a tensor cannot be read (meta, sharded)."""
    h = hashlib.sha256()
    try:
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            flat = t.detach().reshape(-1)
            ends = torch.cat([flat[:4], flat[-4:]]) if flat.numel() > 8 else flat
            h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
            h.update(ends.to("cpu", torch.float64).numpy().tobytes())
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return ""
    return h.hexdigest()[:16]
