"""Model builders named by `_target_` in conf/model/: transformers and timm models, offline.

    model = hf(model_class="GPT2LMHeadModel", config={"n_layer": 2})   # random init, no download
    model = timm_model("vit_tiny_patch16_224", img_size=32)
    model = tiny_lm()   # the small GPT-2 shipped with hookrun, trained on English text
    model = tiny_cnn()  # the small CNN shipped with hookrun, trained on generated shapes
"""

from hookrun.models.hf import hf
from hookrun.models.tiny_cnn import tiny_cnn
from hookrun.models.tiny_lm import tiny_lm
from hookrun.models.vision import timm_model

__all__ = ["hf", "timm_model", "tiny_cnn", "tiny_lm"]
