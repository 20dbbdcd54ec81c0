"""One sparse coder for the SAEs of every format hookrun reads (sae/readers.py reads the files).

    sae = load_sae("saes/blocks.3")                 # a SparseCoder
    f = sae.encode(x); x_hat = sae.decode(f)        # x_hat == sae(x); f has shape (..., d_sae)

The contract, with n the input normalization and a = b_dec if apply_b_dec_to_input else 0:

    pre  = (n(x) - a) @ W_enc + b_enc
    f    = standard: relu(pre)              jumprelu: relu(pre) * (pre > threshold)
           topk: the k largest pre (times |W_dec row| with rescale_acts_by_decoder_norm), relu'd, 0 elsewhere
           groupmax (sparsify): relu(pre) cut into k equal groups, the largest of each group kept
           gated: (u @ W_enc + b_gate > 0) * relu(u @ (W_enc * exp(r_mag)) + b_mag), u = n(x) - a
    x_hat = n^-1(f @ W_dec + b_dec)         (f / |W_dec row| first with rescale_acts_by_decoder_norm)

as SAELens 6 computes them (sparsify's and dictionary_learning's SAEs are the same functions with
other names). n is the identity for normalize_activations none and expected_average_only_in (an SAE
on disk has its scale folded into its weights, as SAELens' trainer does), x * sqrt(d_in)/|x| for
constant_norm_rescale and (x - mean) / (std + 1e-5) for layer_norm; n^-1 undoes the n of the same
rows, so decode() after encode() uses the statistics of the last encode() (forward keeps its own).
The input is cast to the SAE's dtype and the outputs stay in it. `reshape: hook_z` flattens the
last two dims (heads, d_head) on the way in and restores them on the way out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from hookrun.errors import ConfigError

ARCHITECTURES = ("standard", "topk", "jumprelu", "gated", "groupmax")
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")


class SparseCoder(nn.Module):
    """An SAE: encode(x) -> latents (..., d_sae), decode(f) -> (..., d_in), forward = decode . encode."""

    def __init__(self, *, W_enc: Tensor, W_dec: Tensor, b_dec: Tensor, b_enc: Tensor | None = None,  # noqa: N803
                 architecture: str = "standard", k: int | None = None, threshold: Tensor | None = None,
                 b_gate: Tensor | None = None, r_mag: Tensor | None = None, b_mag: Tensor | None = None,
                 apply_b_dec_to_input: bool = True, normalize_activations: str = "none",
                 rescale_acts_by_decoder_norm: bool = False, reshape: str = "none",
                 source: str = "module", hook_name: str | None = None, path: str = "") -> None:
        super().__init__()
        self.path, self.source, self.hook_name = path, source, hook_name
        here = path or "the SAE"
        if architecture not in ARCHITECTURES:
            raise ConfigError(f"{here}: architecture {architecture!r} is not one hookrun reads; it reads {', '.join(ARCHITECTURES)}")
        if normalize_activations not in NORMALIZATIONS:
            raise ConfigError(f"{here}: normalize_activations {normalize_activations!r} is not one hookrun reads; "
                              f"it reads {', '.join(NORMALIZATIONS)}")
        if reshape not in ("none", "hook_z"):
            raise ConfigError(f"{here}: reshape_activations {reshape!r} is not one hookrun reads; it reads none, hook_z")
        if W_enc.dim() != 2:
            raise ConfigError(f"{here}: the encoder weight has shape {tuple(W_enc.shape)}; expected 2 dims (d_in, d_sae)")
        self.d_in, self.d_sae = (int(n) for n in W_enc.shape)
        self.architecture, self.normalize_activations, self.reshape = architecture, normalize_activations, reshape
        self.apply_b_dec_to_input = bool(apply_b_dec_to_input)
        self.rescale_acts_by_decoder_norm = bool(rescale_acts_by_decoder_norm)
        need = {"W_dec": (W_dec, (self.d_sae, self.d_in)), "b_dec": (b_dec, (self.d_in,))}
        if architecture == "gated":
            need |= {"b_gate": (b_gate, (self.d_sae,)), "r_mag": (r_mag, (self.d_sae,)), "b_mag": (b_mag, (self.d_sae,))}
        else:
            need["b_enc"] = (b_enc, (self.d_sae,))
        if architecture == "jumprelu":
            need["threshold"] = (threshold, (self.d_sae,))
        for name, (value, shape) in need.items():
            if value is None:
                raise ConfigError(f"{here}: a {architecture} SAE needs {name} {shape}, and it is missing")
            if tuple(value.shape) != shape:
                raise ConfigError(f"{here}: {name} has shape {tuple(value.shape)} but W_enc {(self.d_in, self.d_sae)} "
                                  f"says {shape} (d_in={self.d_in}, d_sae={self.d_sae})")
        self.W_enc = nn.Parameter(W_enc.detach().clone())
        for name, (value, _) in need.items():
            setattr(self, name, nn.Parameter(value.detach().clone()))
        self.k = None if k is None else int(k)
        if architecture in ("topk", "groupmax") and not (self.k and 0 < self.k <= self.d_sae):
            raise ConfigError(f"{here}: a {architecture} SAE needs k between 1 and d_sae={self.d_sae}, got {k!r}")
        if architecture == "groupmax" and self.d_sae % self.k:
            raise ConfigError(f"{here}: groupmax cuts d_sae={self.d_sae} latents into k={self.k} groups; k must divide d_sae")
        self._last: tuple = (None, None)  # the last encode()'s (undo of the normalization, d_head)

    def extra_repr(self) -> str:
        k = f", k={self.k}" if self.k else ""
        return (f"source={self.source}, architecture={self.architecture}, d_in={self.d_in}, d_sae={self.d_sae}{k}, "
                f"hook_name={self.hook_name!r}")

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    def encode(self, x: Tensor) -> Tensor:
        f, self._last = self._encode(x)
        return f

    def decode(self, f: Tensor) -> Tensor:
        undo, d_head = self._last
        if undo is None and self.normalize_activations in ("constant_norm_rescale", "layer_norm"):
            raise RuntimeError(f"decode() of an SAE with normalize_activations={self.normalize_activations} undoes the "
                               f"normalization of the rows encode() saw last: call encode() first (or forward(x))")
        return self._decode(f, undo, d_head)

    def forward(self, x: Tensor) -> Tensor:
        f, (undo, d_head) = self._encode(x)
        return self._decode(f, undo, d_head)

    @property
    def directions(self) -> Tensor:
        """(d_sae, d_in): what one unit of each latent adds to the reconstruction (before n^-1)."""
        if self.rescale_acts_by_decoder_norm:
            return self.W_dec / self.W_dec.norm(dim=-1, keepdim=True)
        return self.W_dec

    def check_fits(self, features: int | Sequence[int], where: str, *, context: str = "op splice") -> None:
        """A one-line ConfigError unless `features` (the last dim of the tensor to splice, or its
        shape) is d_in, e.g. check_fits(128, "transformer.h.1's output")."""
        if isinstance(features, int):
            n = features
        else:
            shape = tuple(features)
            n = shape[-1] * shape[-2] if self.reshape == "hook_z" and len(shape) >= 2 else shape[-1]
        if n != self.d_in:
            trained = f" (it was trained on {self.hook_name})" if self.hook_name else ""
            raise ConfigError(f"{context}: the SAE in {self.path or '(memory)'} reads d_in={self.d_in} but {where} "
                              f"has {n} features{trained}")

    def _encode(self, x: Tensor) -> tuple[Tensor, tuple]:
        x = x.to(self.W_enc.dtype)
        d_head = None
        if self.reshape == "hook_z":
            d_head = x.shape[-1]
            x = x.flatten(-2)
        x, undo = self._normalize(x)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        if self.architecture == "gated":
            gate = (x @ self.W_enc + self.b_gate > 0).to(x.dtype)
            return gate * torch.relu(x @ (self.W_enc * self.r_mag.exp()) + self.b_mag), (undo, d_head)
        pre = x @ self.W_enc + self.b_enc
        if self.architecture == "standard":
            f = torch.relu(pre)
        elif self.architecture == "jumprelu":
            f = torch.relu(pre) * (pre > self.threshold).to(pre.dtype)
        elif self.architecture == "topk":
            if self.rescale_acts_by_decoder_norm:
                pre = pre * self.W_dec.norm(dim=-1)
            values, index = pre.topk(self.k, dim=-1, sorted=False)
            f = torch.zeros_like(pre).scatter_(-1, index, values.relu())
        else:  # groupmax
            values, index = torch.relu(pre).unflatten(-1, (self.k, -1)).max(dim=-1)
            offsets = torch.arange(0, self.d_sae, self.d_sae // self.k, device=pre.device)
            f = torch.zeros_like(pre).scatter_(-1, index + offsets, values)
        return f, (undo, d_head)

    def _decode(self, f: Tensor, undo, d_head: int | None) -> Tensor:
        f = f.to(self.W_dec.dtype)
        if self.rescale_acts_by_decoder_norm:
            f = f / self.W_dec.norm(dim=-1)
        out = f @ self.W_dec + self.b_dec
        if undo is not None:
            out = undo(out)
        return out.unflatten(-1, (-1, d_head)) if d_head is not None else out

    def _normalize(self, x: Tensor):
        """(n(x), n^-1) for the configured normalization; n^-1 is None where n is the identity."""
        if self.normalize_activations == "constant_norm_rescale":
            coeff = self.d_in ** 0.5 / x.norm(dim=-1, keepdim=True)
            return x * coeff, lambda y: y / coeff
        if self.normalize_activations == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            x = x - mu
            std = x.std(dim=-1, keepdim=True)
            return x / (std + 1e-5), lambda y: y * std + mu
        return x, None
