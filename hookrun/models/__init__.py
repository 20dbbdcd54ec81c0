"""Model builders named by `_target_` in conf/model/: transformers and timm models, offline.

    model = hf(model_class="GPT2LMHeadModel", config={"n_layer": 2})   # random init, no download
    model = timm_model("vit_tiny_patch16_224", img_size=32)
    model = tiny_lm()   # the small GPT-2 shipped with hookrun, trained on English text
    model = tiny_cnn()  # the small CNN shipped with hookrun, trained on generated shapes

Each builder's module is imported when the builder is first named (hookrun/registry.py: lazy_names): a run of a
torchvision model loads none of them. `loading_bars(progress)`, which build_model enters around
every model, says whether a builder shows its library's weight-loading bar (hf's: transformers').
`weights_digest(model)` names a model's weights in a few bytes (the file's `model_fingerprint`).
"""

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from hookrun.registry import lazy_names

__all__ = ["hf", "loading_bars", "same_weights", "timm_model", "tiny_cnn", "tiny_lm", "weights_digest"]
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
    """A digest of the model's parameters and buffers, 32 hex digits: the first 16 by name, dtype, shape
    and each tensor's first and last four values (what files written before 2026-12 hold, 16 digits:
    same_weights compares those with them), the last 16 by every value's bytes as well (xxh3, about
    1.5 GB/s on one core here; a GPU tensor is copied to the host 64 MiB at a time), so one value
    changed anywhere, a neuron zeroed in the middle of a matrix, changes it. '' where a tensor cannot
    be read (meta, sharded)."""
    ends, full = hashlib.sha256(), hashlib.sha256()
    try:
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            flat = t.detach().reshape(-1)
            head = f"{name} {t.dtype} {tuple(t.shape)}"
            ends.update(head.encode())
            ends.update((torch.cat([flat[:4], flat[-4:]]) if flat.numel() > 8 else flat).to("cpu", torch.float64).numpy().tobytes())
            full.update(f"{head} {_bytes_digest(flat)}".encode())
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return ""
    return ends.hexdigest()[:16] + full.hexdigest()[:16]


def same_weights(theirs: str, mine: str) -> bool:
    """Whether a file's model_fingerprint names the weights whose weights_digest is `mine`: an older
    file's 16 digits are compared with the part computed as it was then."""
    return theirs == (mine[:16] if len(theirs) == 16 else mine)


_INTS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_BLOCK = 64 << 20


def _bytes_digest(t: torch.Tensor) -> str:
    """xxh3-64 of the tensor's values' bytes, in order (a non-contiguous tensor is read as reshape sees it)."""
    import xxhash

    flat = t.reshape(-1)
    flat = flat.view(_INTS[flat.element_size()]) if flat.element_size() in _INTS and flat.dtype != torch.bool \
        else flat.to(torch.uint8) if flat.dtype == torch.bool else flat.contiguous().view(torch.uint8)
    h, step = xxhash.xxh3_64(), max(1, _BLOCK // flat.element_size())
    for start in range(0, flat.numel(), step):
        block = flat[start : start + step].cpu().contiguous().numpy()
        h.update(memoryview(block).cast("B"))
    return h.hexdigest()
