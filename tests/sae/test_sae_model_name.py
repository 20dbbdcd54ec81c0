"""The SAE's cfg.json names the model whose activations it reads (SAELens' `model_name`, beside hook_name):
it held hook_name only, so an SAE folder alone did not say which network it belongs to. Reference: SAELens'
own SAE.load_from_disk on the folder; the model a cache was recorded from, read from the cache file's stored
config with h5py and yaml; the class of a model given live."""

from __future__ import annotations

import h5py
import pytest
import yaml
from sae_items import Items, make_model
from test_sae_train import CAPTURE, make_cache

import hookrun
from hookrun.runner.kinds.sae.data import model_name

sae_lens = pytest.importorskip("sae_lens")

TRAIN = {"architecture": "topk", "k": 4, "d_sae": 32, "batch_rows": 16, "rows": 64, "checkpoints": 0}


def test_an_sae_of_a_cache_names_the_caches_model(tmp_path):
    cache = make_cache(tmp_path)
    with h5py.File(cache) as f:
        recorded = yaml.safe_load(f.attrs["config"])["model"]["_target_"]
    cfg = {"model": {"_target_": "torchvision.ops.MLP", "in_channels": 8, "hidden_channels": [16]},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "run" / "captures.h5")},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 4, "shape": [8]}, "batch_size": 4},
           "sae": {"from": cache, "capture": CAPTURE, "out": str(tmp_path / "sae"), **TRAIN}}
    hookrun.run(cfg)
    meta = sae_lens.SAE.load_from_disk(str(tmp_path / "sae")).cfg.metadata
    assert (meta.model_name, meta.hook_name) == (recorded, "0") == ("torchvision.ops.MLP", "0")


def test_an_sae_trained_on_the_fly_on_a_live_model_names_its_class(tmp_path):
    model = make_model()
    cfg = {"device": "cpu", "progress": False, "data": {"batch_size": 16},
           "output": {"path": str(tmp_path / "run" / "captures.h5")},
           "sae": {"at": "2", "out": str(tmp_path / "sae"), **TRAIN}}
    hookrun.run(cfg, model=model, dataset=Items())
    meta = sae_lens.SAE.load_from_disk(str(tmp_path / "sae")).cfg.metadata
    assert meta.model_name == f"{type(model).__module__}.{type(model).__qualname__}" == "torch.nn.modules.container.Sequential"
    assert meta.hook_name == "2"


def test_a_builder_of_many_models_is_named_by_what_it_built():
    assert model_name({"_target_": "hookrun.models.hf", "model_class": "GPT2LMHeadModel", "path": "/m/gpt2"}) == "/m/gpt2"
    assert model_name({"_target_": "hookrun.models.hf", "model_class": "LlamaForCausalLM", "path": None}) == "LlamaForCausalLM"
    assert model_name({"_target_": "hookrun.models.timm_model", "name": "vit_tiny_patch16_224"}) == "vit_tiny_patch16_224"
    assert model_name(None) is None  # (no model node: SAELens' default, null)
