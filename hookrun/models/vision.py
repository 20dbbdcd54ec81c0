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
