"""Model builders named by `_target_` in conf/model/: transformers and timm models, offline.

    model = hf(model_class="GPT2LMHeadModel", config={"n_layer": 2})   # random init, no download
    model = timm_model("vit_tiny_patch16_224", img_size=32)
"""

from hookrun.models.hf import hf
from hookrun.models.vision import timm_model

__all__ = ["hf", "timm_model"]
