"""A model's weights read from a file the config names (`model.checkpoint`), and the line for pretrained
weights that are neither cached nor downloadable: config/build.py's build_model imports it only where
a node gives a checkpoint, or where building it failed on the download.

    load_checkpoint(model, "trained.pt")   # a plain state_dict, weights_only=True; one ConfigError line otherwise
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from hookrun.error_words import not_a_state_dict
from hookrun.errors import ConfigError


def load_checkpoint(model: nn.Module, path: str, key: str = "model") -> None:
    """Load a plain state_dict with weights_only=True: no arbitrary object is ever unpickled."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"{key}.checkpoint: no file {path!r}") from None
    except Exception as exc:  # UnpicklingError and friends: not a plain tensor file
        raise ConfigError(
            f"{key}.checkpoint: {path!r} is not a plain state_dict ({not_a_state_dict(exc)}); save one with "
            f"torch.save(model.state_dict(), path)"
        ) from None
    for wrapper in ("state_dict", "model"):  # (a training checkpoint's dict around the state_dict)
        if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
            state = state[wrapper]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(
            f"{key}.checkpoint: {path!r} holds a {type(state).__name__}, not a state_dict of tensors "
            f"(save it with torch.save(model.state_dict(), path))"
        )
    try:  # the keys as the modules read them: a BatchNorm fills in the num_batches_tracked an older file lacks
        result = model.load_state_dict(state, strict=False)
        missing, unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    except RuntimeError as exc:  # shape mismatches: said where the keys fit
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if not (missing or unexpected):
            detail = [line.strip() for line in str(exc).splitlines()[1:3]]
            raise ConfigError(f"{key}.checkpoint: {path!r} does not fit {type(model).__name__}: {' '.join(detail)}") from None
    if missing or unexpected:
        raise ConfigError(
            f"{key}.checkpoint: {path!r} does not fit {type(model).__name__}: missing keys "
            f"{missing[:5]}, unexpected keys {unexpected[:5]}{_prefix_hint(state, missing)}"
        )


def _prefix_hint(state: Mapping, missing: list[str]) -> str:
    """'; the keys all start with 'module.' ...' where one wrapper's prefix on every key is all that differs."""
    for prefix in ("module.", "_orig_mod.", "model."):
        if state and all(k.startswith(prefix) for k in state) and set(missing) <= {k[len(prefix):] for k in state}:
            return (f"; every key starts with {prefix!r} (a DataParallel/DDP, torch.compile or Lightning wrapper's "
                    f"state_dict): save the inner model's state_dict, or the keys without {prefix!r}")
    return ""


def weights_message(node: Mapping, error: str, key: str = "model") -> str:
    """Pretrained weights that are not cached and cannot be downloaded: say where torchvision looks."""
    where = Path(torch.hub.get_dir()) / "checkpoints"
    try:
        from torchvision.models import get_model_weights

        weights = node["weights"]
        enum = get_model_weights(node["_target_"].rsplit(".", 1)[-1])
        url = (enum[weights] if isinstance(weights, str) and weights in enum.__members__ else enum.DEFAULT).url
        where = where / url.rsplit("/", 1)[-1]
    except Exception:  # not a torchvision builder: name the folder only
        pass
    reason = error.split("Error: ", 1)[-1]
    return (f"{key}.weights={node['weights']}: the pretrained weights are not in the torch hub cache and cannot be "
            f"downloaded ({reason}); put the file at {where} (TORCH_HOME moves the cache), or give "
            f"{key}.weights=null {key}.checkpoint=PATH with a state_dict file of your own")
