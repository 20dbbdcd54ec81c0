"""Write the SAE fixtures of tests/sae/test_sae_formats.py with the peer libraries themselves.

Each fixture is a folder as the peer saves it (d_in 8, d_sae 16, random weights) plus
`reference.safetensors`: an input `x` and the peer's own `latents` (encode) and `recon` (decode of
those latents), computed by the peer after loading the folder back from disk. The tests run
without the peers and compare hookrun's load_sae against these. Each peer lives in a venv of its
own (they pin different versions of TransformerLens and friends):

    python3 -m venv /work/venvs/saelens && /work/venvs/saelens/bin/pip install sae-lens           # 6.54
    python3 -m venv /work/venvs/sparsify && /work/venvs/sparsify/bin/pip install eai-sparsify     # 1.3
    python3 -m venv /work/venvs/dictlearn && /work/venvs/dictlearn/bin/pip install dictionary-learning  # 0.1.0
    python3 tests/data/sae/make_fixtures.py hookrun      # (this repo's python, with sae-lens) the sae kind's out
    /work/venvs/saelens/bin/python tests/data/sae/make_fixtures.py saelens      # also references hookrun_trained
    /work/venvs/sparsify/bin/python tests/data/sae/make_fixtures.py sparsify
    /work/venvs/dictlearn/bin/python tests/data/sae/make_fixtures.py dictionary_learning

Run `hookrun` before `saelens`: SAELens itself loads the folder hookrun wrote, which is the
check that SAEs trained with hookrun load in SAELens.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
D_IN, D_SAE = 8, 16


def fresh(name: str) -> Path:
    folder = HERE / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Every weight random (the peers initialise biases and thresholds to 0, which would test little)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not p.is_floating_point():
                continue
            if "threshold" in name:
                p.copy_(torch.rand(p.shape, generator=g) * 0.6)
            elif name == "r_mag":
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def inputs(seed: int, shape: tuple[int, ...] = (2, 3, D_IN)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 2


def reference(folder: Path, x: torch.Tensor, latents: torch.Tensor, recon: torch.Tensor) -> None:
    save_file({"x": x.contiguous(), "latents": latents.detach().contiguous(), "recon": recon.detach().contiguous()},
              str(folder / "reference.safetensors"))


# -- SAELens ---------------------------------------------------------------------------------
def saelens() -> None:
    import sae_lens
    from sae_lens import (
        SAE,
        GatedSAE,
        GatedSAEConfig,
        JumpReLUSAE,
        JumpReLUSAEConfig,
        StandardSAE,
        StandardSAEConfig,
        TopKSAE,
        TopKSAEConfig,
    )
    from sae_lens.saes.sae import SAEMetadata

    print("sae_lens", sae_lens.__version__)
    hook = {"hook_name": "blocks.1.hook_resid_post"}
    cases = {
        "saelens_standard": (StandardSAE, StandardSAEConfig, {}),
        "saelens_standard_no_b_dec_in": (StandardSAE, StandardSAEConfig, {"apply_b_dec_to_input": False}),
        "saelens_topk": (TopKSAE, TopKSAEConfig, {"k": 4}),
        "saelens_topk_rescaled": (TopKSAE, TopKSAEConfig, {"k": 4, "rescale_acts_by_decoder_norm": True}),
        "saelens_jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {}),
        "saelens_gated": (GatedSAE, GatedSAEConfig, {}),
        "saelens_constant_norm": (StandardSAE, StandardSAEConfig, {"normalize_activations": "constant_norm_rescale"}),
        "saelens_layer_norm": (JumpReLUSAE, JumpReLUSAEConfig, {"normalize_activations": "layer_norm"}),
        "saelens_expected_average": (TopKSAE, TopKSAEConfig, {"k": 4, "normalize_activations": "expected_average_only_in"}),
        "saelens_float64": (StandardSAE, StandardSAEConfig, {"dtype": "float64"}),
        "saelens_hook_z": (StandardSAE, StandardSAEConfig, {"reshape_activations": "hook_z"}),
    }
    for i, (name, (cls, cfg_cls, kw)) in enumerate(cases.items()):
        meta = {"hook_name": "blocks.0.attn.hook_z"} if name == "saelens_hook_z" else hook
        sae = cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, metadata=SAEMetadata(**meta), **kw))
        randomize(sae, seed=i)
        folder = fresh(name)
        sae.save_model(folder)
        x = inputs(100 + i, (3, 2, 4) if name == "saelens_hook_z" else (2, 3, D_IN))
        write_saelens_reference(SAE, folder, x.to(torch.float64) if name == "saelens_float64" else x)

    # a cfg of SAELens < 6 (top-level hook_point, activation_fn_str, no architecture), as 5.x wrote them
    for name, extra in (("saelens_pre6", {"activation_fn_str": "relu"}),
                        ("saelens_pre6_topk", {"activation_fn_str": "topk", "activation_fn_kwargs": {"k": 4}})):
        sae = StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE))
        randomize(sae, seed=len(name))
        folder = fresh(name)
        save_file({k: v.contiguous() for k, v in sae.state_dict().items()}, str(folder / "sae_weights.safetensors"))
        cfg = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", "model_name": "gpt2",
               "hook_point": "blocks.2.hook_resid_pre", "hook_point_layer": 2, "hook_point_head_index": None,
               "apply_b_dec_to_input": True, "normalize_activations": False, "context_size": 128,
               "sae_lens_training_version": "3.13.0", **extra}
        (folder / "cfg.json").write_text(json.dumps(cfg))
        write_saelens_reference(SAE, folder, inputs(200 + len(name)))

    trained = HERE / "hookrun_trained"
    if (trained / "cfg.json").is_file():  # written by the sae kind (`make_fixtures.py hookrun`)
        write_saelens_reference(SAE, trained, inputs(300))
    else:
        print("no hookrun_trained/: run `python3 tests/data/sae/make_fixtures.py hookrun` first")


def write_saelens_reference(SAE, folder: Path, x: torch.Tensor) -> None:  # noqa: N803
    sae = SAE.load_from_disk(str(folder))  # the peer reads the folder back: the reference is what it loads
    with torch.no_grad():
        latents = sae.encode(x)
        recon = sae.decode(latents)
        assert torch.allclose(sae(x), recon, atol=1e-6)
    reference(folder, x, latents, recon)
    print(f"{folder.name}: {type(sae).__name__} L0 {(latents != 0).float().sum(-1).mean():.2f}")


# -- sparsify --------------------------------------------------------------------------------
def sparsify() -> None:
    import sparsify.sparse_coder
    from sparsify import SparseCoder, SparseCoderConfig
    from sparsify.config import TrainConfig
    from sparsify.utils import eager_decode

    # with triton installed, sparsify decodes with a GPU kernel; its eager decoder is the same sum on a CPU
    sparsify.sparse_coder.decoder_impl = eager_decode

    def write(folder: Path, cfg: SparseCoderConfig, seed: int) -> None:
        sae = SparseCoder(D_IN, cfg)
        randomize(sae, seed)
        sae.save_to_disk(folder)
        sae = SparseCoder.load_from_disk(folder)
        x = inputs(400 + seed, (6, D_IN))  # sparsify's decoder (embedding_bag) takes 2-d inputs
        with torch.no_grad():
            top_acts, top_indices, _ = sae.encode(x)
            latents = torch.zeros(x.shape[0], sae.num_latents).scatter_(-1, top_indices, top_acts)
            recon = sae.decode(top_acts, top_indices)
        reference(folder, x, latents, recon)
        print(f"{folder.relative_to(HERE)}: sparsify {cfg.activation} k={cfg.k}")

    write(fresh("sparsify_topk"), SparseCoderConfig(num_latents=D_SAE, k=4), 0)
    write(fresh("sparsify_groupmax"), SparseCoderConfig(expansion_factor=2, k=4, activation="groupmax"), 1)
    ckpt = fresh("sparsify_checkpoint")  # a training checkpoint: one folder per hookpoint + the run's config.json
    for i, hookpoint in enumerate(["h.0", "h.1"]):
        write(ckpt / hookpoint, SparseCoderConfig(num_latents=D_SAE, k=3), 2 + i)
    TrainConfig(SparseCoderConfig(num_latents=D_SAE, k=3), hookpoints=["h.0", "h.1"]).save_json(ckpt / "config.json")


# -- dictionary_learning ---------------------------------------------------------------------
def dictionary_learning() -> None:
    from dictionary_learning import utils
    from dictionary_learning.dictionary import (
        AutoEncoder,
        AutoEncoderNew,
        GatedAutoEncoder,
        JumpReluAutoEncoder,
    )
    from dictionary_learning.trainers.batch_top_k import BatchTopKSAE
    from dictionary_learning.trainers.matryoshka_batch_top_k import MatryoshkaBatchTopKSAE
    from dictionary_learning.trainers.top_k import AutoEncoderTopK

    classes = {"AutoEncoder": lambda: AutoEncoder(D_IN, D_SAE), "AutoEncoderNew": lambda: AutoEncoderNew(D_IN, D_SAE),
               "GatedAutoEncoder": lambda: GatedAutoEncoder(D_IN, D_SAE),
               "JumpReluAutoEncoder": lambda: JumpReluAutoEncoder(D_IN, D_SAE),
               "AutoEncoderTopK": lambda: AutoEncoderTopK(D_IN, D_SAE, k=4),
               "BatchTopKSAE": lambda: BatchTopKSAE(D_IN, D_SAE, k=4),
               "MatryoshkaBatchTopKSAE": lambda: MatryoshkaBatchTopKSAE(D_IN, D_SAE, k=4, group_sizes=[4, 12])}
    for i, (cls, make) in enumerate(classes.items()):
        ae = make()
        randomize(ae, 500 + i)
        if "BatchTopK" in cls:
            ae.threshold.fill_(0.3)  # a learned threshold, as training leaves it (the AutoEncoder's decoder
            # rows are not unit norm either: its from_pretrained folds their norms into the encoder)
        folder = fresh(f"dictlearn_{cls}")
        torch.save({k: v.cpu() for k, v in ae.state_dict().items()}, folder / "ae.pt")
        trainer = {"dict_class": cls, "activation_dim": D_IN, "dict_size": D_SAE, "submodule_name": "resid_post_layer_3",
                   "layer": 3, "lm_name": "EleutherAI/pythia-70m-deduped"}
        if hasattr(ae, "k"):
            trainer["k"] = int(ae.k)
        (folder / "config.json").write_text(json.dumps({"trainer": trainer}, indent=4))
        ae, _ = utils.load_dictionary(str(folder), device="cpu")  # the peer's own loader
        x = inputs(600 + i)
        with torch.no_grad():
            latents = ae.encode(x)
            recon = ae.decode(latents)
        reference(folder, x, latents, recon)
        print(f"{folder.name}: L0 {(latents != 0).float().sum(-1).mean():.2f}")


# -- hookrun's own: the `sae:` kind's out folder --------------------------------------------
def hookrun() -> None:
    """Train a standard SAE with the `sae:` kind (SAELens' trainer) for a few steps on a tiny cache."""
    import tempfile

    import numpy as np

    import hookrun as hr
    from hookrun.store.h5store import H5Store
    from hookrun.store.records import Capture, CaptureKey, StepRecord

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache.h5"
        x = np.random.default_rng(0).standard_normal((256, D_IN)).astype(np.float32)
        with H5Store(cache, {"config": "{}"}) as store:
            cap = Capture(CaptureKey("res", "transformer.h.1", "forward", "output"), torch.from_numpy(x), False)
            store.write(StepRecord(0, np.arange(len(x)), None, None, [cap]))
        folder = HERE / "hookrun_trained"
        shutil.rmtree(folder, ignore_errors=True)
        hr.run({"model": {"_target_": "torchvision.ops.MLP", "in_channels": D_IN, "hidden_channels": [D_IN]},
                "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 1, "shape": [D_IN], "num_classes": 2},
                         "batch_size": 1},
                "device": "cpu", "progress": False, "output": {"path": str(Path(tmp) / "run" / "captures.h5")},
                "sae": {"from": str(cache), "capture": "res/transformer.h.1/output", "architecture": "standard",
                        "d_sae": D_SAE, "batch_rows": 64, "rows": 256, "out": str(folder)}})


if __name__ == "__main__":
    {"saelens": saelens, "sparsify": sparsify, "dictionary_learning": dictionary_learning, "hookrun": hookrun}[sys.argv[1]]()
