"""Reading trained sparse autoencoders: SAELens, sparsify and dictionary_learning folders, or any module.

    sae = load_sae("saes/gpt2-res-3")               # a SparseCoder (sae/coder.py); sae(x), sae.encode(x)
    sae.check_fits(128, "transformer.h.3's output") # a one-line ConfigError unless d_in == 128

A folder is recognised by its files:
  cfg.json + sae_weights.safetensors   SAELens (and hookrun's own: the `sae:` kind's out)
  cfg.json + sae.safetensors           sparsify (EleutherAI); a checkpoint holds one such folder per hookpoint
  ae.pt + config.json                  dictionary_learning (saprmarks)
Every problem (no such folder, unknown files, architecture or normalization, tensors that disagree)
is one ConfigError line naming the folder and what would be right. load_module builds any
nn.Module from a `_target_` and an optional state dict file, for SAEs of other libraries.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hookrun.errors import ConfigError
from hookrun.sae.coder import SparseCoder
from hookrun.sae.module_coder import ModuleCoder, load_module, read_safetensors, read_state_dict
from hookrun.store.paths import local_path, scheme_of

__all__ = ["SparseCoder", "check_finite_weights", "load_sae", "load_module", "ModuleCoder"]

FORMATS = ("cfg.json + sae_weights.safetensors (SAELens), cfg.json + sae.safetensors (sparsify) "
           "or ae.pt + config.json (dictionary_learning)")
SAELENS_ARCHITECTURES = {"standard": "standard", "topk": "topk", "jumprelu": "jumprelu", "gated": "gated"}
DTYPES = {"float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
          "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16}


def load_sae(path: str | os.PathLike, *, device: Any = None, dtype: torch.dtype | str | None = None,
             where: str | None = None) -> SparseCoder:
    """The SAE in `path` (a folder, or a file in it), on `device`, in `dtype` (default: the SAE's),
    in eval mode without gradients for its weights. `where` prefixes error messages ("op splice")."""
    lead = f"{where}: " if where else ""
    if scheme_of(path).remote:  # (Path() would read a local folder named 's3:')
        raise ConfigError(f"{lead}{str(path)!r} is a URL; SAE folders are read from local disk only: copy the "
                          "folder down and give its local path")
    folder = Path(local_path(path)).expanduser()
    if folder.is_file() and folder.name in ("sae_weights.safetensors", "sae.safetensors", "ae.pt", "cfg.json", "config.json"):
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{lead}no SAE folder {folder} (expected a folder with {FORMATS})")
    names = sorted(p.name for p in folder.iterdir())
    try:
        if "cfg.json" in names and "sae_weights.safetensors" in names:
            sae = _saelens(folder)
        elif "cfg.json" in names and "sae.safetensors" in names:
            sae = _sparsify(folder)
        elif "ae.pt" in names and "config.json" in names:
            sae = _dictionary_learning(folder)
        else:
            inner = [p for p in sorted(folder.iterdir()) if p.is_dir() and _is_sae_folder(p)]
            if inner:
                shown = ", ".join(str(p) for p in inner[:6]) + (", ..." if len(inner) > 6 else "")
                raise ConfigError(f"{folder} holds one SAE per hook point; give one of them: {shown}")
            found = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ConfigError(f"{folder} is no SAE folder I know: found [{found}]; expected {FORMATS}")
    except ConfigError as exc:
        raise ConfigError(f"{lead}{exc}") from None
    target_dtype = DTYPES.get(dtype.removeprefix("torch.")) if isinstance(dtype, str) else dtype
    if dtype is not None and not isinstance(target_dtype, torch.dtype):
        raise ConfigError(f"{lead}dtype {dtype!r} for the SAE in {folder}: choose one of {', '.join(DTYPES)}")
    check_finite_weights(sae, f"{lead}the SAE in {folder}")
    sae = sae.to(device=device, dtype=target_dtype) if (device is not None or target_dtype is not None) else sae
    return sae.requires_grad_(False).eval()


def check_finite_weights(module: torch.nn.Module, what: str) -> None:
    """Refuse a learned module with a NaN or infinite weight (it would splice NaN into every batch),
    naming the tensor."""
    for name, t in module.state_dict().items():
        if torch.is_floating_point(t) and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            kinds = "/".join(k for k, f in (("NaN", torch.isnan), ("inf", torch.isinf)) if bool(f(t).any()))
            raise ConfigError(f"{what}: its tensor {name} holds {bad} non-finite value(s) ({kinds}) of {t.numel()}; "
                              f"the weights are damaged (a diverged training run?): retrain or re-save them")


def _is_sae_folder(p: Path) -> bool:
    return ((p / "cfg.json").is_file() and ((p / "sae.safetensors").is_file() or (p / "sae_weights.safetensors").is_file())
            or (p / "ae.pt").is_file() and (p / "config.json").is_file())


def _json(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not a readable JSON file: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} holds a JSON {type(cfg).__name__}, expected an object")
    return cfg


def _take(weights: dict[str, Tensor], names: list[str], file: Path, what: str) -> list[Tensor]:
    missing = [n for n in names if n not in weights]
    if missing:
        raise ConfigError(f"{file}: a {what} needs tensors {', '.join(missing)}; the file has {', '.join(sorted(weights)) or 'none'}")
    return [weights[n] for n in names]


def _no_extra(weights: Mapping[str, Tensor], used: set[str], file: Path, what: str) -> None:
    extra = sorted(set(weights) - used)
    if extra:
        raise ConfigError(f"{file}: tensors {', '.join(extra)} are not part of a {what} ({', '.join(sorted(used))}); "
                          f"is this another architecture?")


def _saelens(folder: Path) -> SparseCoder:
    """SAELens 6 (cfg.json + sae_weights.safetensors), and older cfgs read as SAELens 6 reads them."""
    cfg = _json(folder / "cfg.json")
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    version = str(cfg.get("sae_lens_version") or meta.get("sae_lens_version") or "0")
    old = int(re.match(r"\d*", version).group() or 0) < 6
    arch = cfg.get("architecture") or "standard"
    k = cfg.get("k")
    if old and cfg.get("activation_fn", cfg.get("activation_fn_str")) == "topk" and (cfg.get("activation_fn_kwargs") or {}).get("k"):
        arch, k = "topk", cfg["activation_fn_kwargs"]["k"]
    norm = cfg.get("normalize_activations")
    norm = {None: "none", False: "none", True: "expected_average_only_in"}.get(norm, norm) if not isinstance(norm, str) else norm
    file = folder / "sae_weights.safetensors"
    if arch not in SAELENS_ARCHITECTURES:
        raise ConfigError(f"{folder / 'cfg.json'}: architecture {arch!r} is not one hookrun reads; "
                          f"SAELens folders: {', '.join(SAELENS_ARCHITECTURES)}")
    if norm == "covariance_whitening":
        raise ConfigError(f"{folder / 'cfg.json'}: normalize_activations covariance_whitening means the whitening is not "
                          f"folded into these weights (a checkpoint from mid-training); SAELens folds it when training "
                          f"ends (then normalize_activations is none): load that final SAE")
    weights = read_safetensors(file)
    scale = weights.pop("scaling_factor", None)
    if scale is not None and not torch.allclose(scale, torch.ones_like(scale)):
        raise ConfigError(f"{file}: a scaling_factor other than 1 (a finetuned SAE of SAELens < 6) is not read by "
                          f"SAELens 6 nor by hookrun; fold it into W_dec (W_dec * scaling_factor[:, None]) first")
    names = {"standard": ["W_enc", "W_dec", "b_enc", "b_dec"], "topk": ["W_enc", "W_dec", "b_enc", "b_dec"],
             "jumprelu": ["W_enc", "W_dec", "b_enc", "b_dec", "threshold"],
             "gated": ["W_enc", "W_dec", "b_dec", "b_gate", "r_mag", "b_mag"]}[arch]
    tensors = dict(zip(names, _take(weights, names, file, f"SAELens {arch} SAE"), strict=True))
    _no_extra(weights, set(names), file, f"SAELens {arch} SAE")
    for n, shape in (("d_in", tensors["W_enc"].shape[0]), ("d_sae", tensors["W_enc"].shape[-1])):
        if n in cfg and cfg[n] != shape:
            raise ConfigError(f"{folder / 'cfg.json'} says {n}={cfg[n]} but W_enc in {file.name} has shape "
                              f"{tuple(tensors['W_enc'].shape)} (d_in, d_sae)")
    hook = meta.get("hook_name") or cfg.get("hook_name") or cfg.get("hook_point")
    reshape = cfg.get("reshape_activations") or ("hook_z" if old and "hook_z" in str(hook or "") else "none")
    dtype = DTYPES.get(str(cfg.get("dtype", "float32")).removeprefix("torch."))
    if dtype is None:
        raise ConfigError(f"{folder / 'cfg.json'}: dtype {cfg.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    sae = SparseCoder(**tensors, architecture=SAELENS_ARCHITECTURES[arch], k=k,
                      apply_b_dec_to_input=cfg.get("apply_b_dec_to_input", True), normalize_activations=norm,
                      rescale_acts_by_decoder_norm=arch == "topk" and cfg.get("rescale_acts_by_decoder_norm", False),
                      reshape=reshape, source="saelens", hook_name=hook, path=str(folder))
    return sae.to(dtype)


def _sparsify(folder: Path) -> SparseCoder:
    """sparsify's SparseCoder: encoder (d_sae, d_in) Linear, W_dec (d_sae, d_in), b_dec subtracted first."""
    cfg = _json(folder / "cfg.json")
    file = folder / "sae.safetensors"
    for key, what in (("transcode", "a transcoder (it reads a module's input to predict its output)"),
                      ("skip_connection", "a sparse coder with a skip connection (W_skip)")):
        if cfg.get(key):
            raise ConfigError(f"{folder / 'cfg.json'}: {key}: true is {what}; hookrun reads sparsify autoencoders")
    weights = read_safetensors(file)
    names = ["encoder.weight", "encoder.bias", "W_dec", "b_dec"]
    enc, b_enc, w_dec, b_dec = _take(weights, names, file, "sparsify SAE")
    _no_extra(weights, set(names), file, "sparsify SAE")
    d_sae, d_in = enc.shape
    want = cfg.get("num_latents") or (cfg.get("expansion_factor") or 0) * d_in
    if cfg.get("d_in", d_in) != d_in or want and want != d_sae:
        raise ConfigError(f"{folder / 'cfg.json'} says d_in={cfg.get('d_in')}, num_latents={cfg.get('num_latents')}, "
                          f"expansion_factor={cfg.get('expansion_factor')} but encoder.weight has shape {tuple(enc.shape)} (d_sae, d_in)")
    activation = cfg.get("activation", "topk")
    if activation not in ("topk", "groupmax"):
        raise ConfigError(f"{folder / 'cfg.json'}: activation {activation!r} is not one hookrun reads; sparsify's: topk, groupmax")
    run_cfg = folder.parent / "config.json"  # a training checkpoint names its hookpoints (one subfolder each)
    hook = None
    if run_cfg.is_file():
        try:
            hook = folder.name if folder.name in (json.loads(run_cfg.read_text()).get("hookpoints") or []) else None
        except (OSError, ValueError, AttributeError):
            hook = None
    return SparseCoder(W_enc=enc.T, b_enc=b_enc, W_dec=w_dec, b_dec=b_dec, architecture=activation, k=cfg.get("k"),
                       source="sparsify", hook_name=hook, path=str(folder))


# dictionary_learning's classes: (architecture, {SparseCoder argument: the class's tensor}); an
# nn.Linear's weight is stored transposed. Buffers k, threshold and group_sizes may come along.
_LINEAR = {"W_enc": "encoder.weight", "b_enc": "encoder.bias", "W_dec": "decoder.weight", "b_dec": "b_dec"}
_PARAMS = {"W_enc": "W_enc", "b_enc": "b_enc", "W_dec": "W_dec", "b_dec": "b_dec", "threshold": "threshold"}
_DL = {
    "AutoEncoder": ("standard", {**_LINEAR, "b_dec": "bias"}),
    "AutoEncoderNew": ("standard", {**_LINEAR, "b_dec": "decoder.bias"}),
    "GatedAutoEncoder": ("gated", {"W_enc": "encoder.weight", "W_dec": "decoder.weight", "b_dec": "decoder_bias",
                                   "r_mag": "r_mag", "b_gate": "gate_bias", "b_mag": "mag_bias"}),
    "AutoEncoderTopK": ("topk", _LINEAR),
    "BatchTopKSAE": ("jumprelu", {**_LINEAR, "threshold": "threshold"}),  # at inference: relu(pre) > its threshold
    "MatryoshkaBatchTopKSAE": ("jumprelu", _PARAMS),
    "JumpReluAutoEncoder": ("jumprelu", _PARAMS),
}


def _dictionary_learning(folder: Path) -> SparseCoder:
    """dictionary_learning's ae.pt + config.json, as its utils.load_dictionary reads them."""
    trainer = _json(folder / "config.json").get("trainer") or {}
    cls = trainer.get("dict_class")
    file = folder / "ae.pt"
    if cls not in _DL:
        raise ConfigError(f"{folder / 'config.json'}: trainer.dict_class {cls!r} is not one hookrun reads; "
                          f"it reads {', '.join(_DL)}")
    state = read_state_dict(file)
    if isinstance(state.get("ae"), Mapping):  # a training backup: {"ae": state_dict, "optimizer": ...}
        state = dict(state["ae"])
    arch, names = _DL[cls]
    found = _take(state, list(names.values()), file, cls)
    _no_extra(state, set(names.values()) | {"k", "threshold", "group_sizes"}, file, cls)
    kw: dict[str, Any] = {ours: t.T if theirs.endswith(".weight") else t
                          for (ours, theirs), t in zip(names.items(), found, strict=True)}
    if cls == "AutoEncoder":  # its from_pretrained makes the decoder's rows unit norm, scaling the encoder
        norms = kw["W_dec"].norm(dim=1)
        norms = torch.where(norms > 0, norms, torch.ones_like(norms))
        kw |= {"W_dec": kw["W_dec"] / norms[:, None], "W_enc": kw["W_enc"] * norms, "b_enc": kw["b_enc"] * norms}
    if arch == "jumprelu" and kw["threshold"].dim() == 0:  # the BatchTopK kinds learn one scalar threshold
        kw["threshold"] = kw["threshold"].expand(kw["W_enc"].shape[1]).to(kw["W_enc"].dtype)
    if arch == "topk":
        kw["k"] = trainer.get("k") or (int(state["k"]) if "k" in state else None)
    kw["apply_b_dec_to_input"] = cls not in ("AutoEncoderNew", "JumpReluAutoEncoder")  # as their encode() does
    d_in, d_sae = kw["W_enc"].shape
    for key, n in (("activation_dim", d_in), ("dict_size", d_sae)):
        if key in trainer and trainer[key] != n:
            raise ConfigError(f"{folder / 'config.json'} says {key}={trainer[key]} but {file.name} holds a "
                              f"{d_in} -> {d_sae} {cls}")
    return SparseCoder(**kw, architecture=arch, source="dictionary_learning",
                       hook_name=trainer.get("submodule_name"), path=str(folder))
