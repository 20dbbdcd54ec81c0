"""Model builders named by `_target_` in conf/model/: transformers and timm models, offline.

    model = hf(model_class="GPT2LMHeadModel", config={"n_layer": 2})   # random init, no download
    model = timm_model("vit_tiny_patch16_224", img_size=32)
    model = tiny_lm()   # the small GPT-2 shipped with hookrun, trained on English text
    model = tiny_cnn()  # the small CNN shipped with hookrun, trained on generated shapes

Each builder's module is imported when the builder is first named (hookrun/errors.py: lazy_names): a run of a
torchvision model loads none of them, nor this package. Whether a builder shows its library's weight-loading
bar (hf's: transformers') is config/build.py's `loading_bars(progress)`, which build_model enters around every
model; `weights_digest(model)`, which names a model's weights in a few bytes (the file's `model_fingerprint`),
is config/build.py's too.
"""

from hookrun.errors import lazy_names

__all__ = ["hf", "timm_model", "tiny_cnn", "tiny_lm"]
lazy_names(__name__, {"hf": "hf", "timm_model": "vision", "tiny_cnn": "tiny_cnn", "tiny_lm": "tiny_lm"})
