"""timm models, random init (no download).

    model = timm_model("vit_tiny_patch16_224", img_size=32, num_classes=10)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hookrun.errors import ConfigError


def timm_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """`timm.create_model(name, pretrained=False, **kwargs)`; pretrained weights come from the hub,
    so offline runs keep `pretrained: false` (or load model.checkpoint=FILE)."""
    try:
        import timm
    except ImportError:
        raise ConfigError("model=timm needs timm: pip install 'hookrun[hf]'") from None
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise ConfigError(f"model.name: timm has no model {name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"model: timm.create_model({name!r}) failed: {str(exc).splitlines()[0]}") from None
    except OSError as exc:  # huggingface_hub's LocalEntryNotFoundError: not cached, and no network
        if not pretrained:
            raise
        raise ConfigError(f"model.pretrained=true: timm's weights for {name!r} are not in the Hugging Face cache and "
                          f"cannot be downloaded ({type(exc).__name__}); set model.pretrained=false (random init), "
                          f"or give model.checkpoint=PATH with a state_dict file") from None


def torchvision_cached(name: str, weights: Any = "cached", **kwargs: Any) -> nn.Module:
    """torchvision's `name` with its DEFAULT weights where they are in the torch hub cache, random
    weights otherwise (with a warning saying so): nothing is downloaded. `weights` other than
    "cached" (null, DEFAULT, IMAGENET1K_V2) goes to torchvision as it is.

        model = torchvision_cached("resnet50")    # experiment=attribution_resnet50's model
    """
    import logging
    from pathlib import Path

    import torch
    import torchvision

    try:
        builder = torchvision.models.get_model_builder(name)
        default = torchvision.models.get_model_weights(name).DEFAULT
    except ValueError:
        raise ConfigError(f"model.name={name!r}: torchvision has no such model") from None
    if weights != "cached":
        return builder(weights=weights, **kwargs)
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(default.url).name
    if cached.is_file():
        return builder(weights=default, **kwargs)
    logging.getLogger("hookrun").warning(
        "model %s: its DEFAULT weights are not in the torch hub cache (%s); the model is RANDOM (its maps show the "
        "method, not what a trained network looks at)", name, cached)
    return builder(weights=None, **kwargs)
