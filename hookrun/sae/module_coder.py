"""Any nn.Module as an SAE (for libraries hookrun has no reader for), and reading state dict files.

    coder = load_module("my_lib.MySAE", "weights.safetensors", d_in=512, d_sae=4096)
    x_hat = coder(x)                    # the module's output (its first element, where it returns a tuple)

The input (and decode's latents) is cast to the module's dtype, that of its first float parameter, as
SparseCoder casts to the SAE's: a float32 module reads a bfloat16 model's output (the splice casts the
reconstruction back to the model's dtype).

The module is built by hookrun.config.build.build (a `_target_` node, one-line errors) and its
state dict read with torch.load(weights_only=True) (.pt/.pth: nothing is unpickled) or safetensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hookrun.error_words import not_a_state_dict
from hookrun.errors import ConfigError


def read_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a readable safetensors file: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None


def read_state_dict(file: Path) -> dict[str, Tensor]:
    """A state dict from .pt/.pth (torch.load weights_only=True: nothing is unpickled) or .safetensors."""
    if file.suffix == ".safetensors":
        return read_safetensors(file)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"no file {file}") from None
    except Exception as exc:  # UnpicklingError and friends
        raise ConfigError(f"{file} is not a plain state dict ({not_a_state_dict(exc)}); save one with "
                          f"torch.save(module.state_dict(), path)") from None
    if not isinstance(state, Mapping):
        raise ConfigError(f"{file} holds a {type(state).__name__}, not a state dict (a mapping of names to tensors)")
    return dict(state)


class ModuleCoder(nn.Module):
    """Any module as a coder: forward(x) -> x_hat (the first element where the module returns a tuple,
    `sae_out` where it returns a named tuple), encode/decode where the module has them."""

    def __init__(self, module: nn.Module, path: str = "") -> None:
        super().__init__()
        self.module, self.path, self.source = module, path, "module"
        self.architecture = type(module).__name__
        self.hook_name = getattr(module, "hook_name", None)
        w = self.W_dec
        self.d_in = _attr_int(module, "d_in", "activation_dim", default=None if w is None else int(w.shape[1]))
        self.d_sae = _attr_int(module, "d_sae", "dict_size", "num_latents", default=None if w is None else int(w.shape[0]))
        self.has_encode = callable(getattr(module, "encode", None)) and callable(getattr(module, "decode", None))

    @property
    def W_dec(self) -> Tensor | None:  # noqa: N802 (the peers' name)
        w = getattr(self.module, "W_dec", None)
        if isinstance(w, Tensor) and w.dim() == 2:
            return w
        dec = getattr(self.module, "decoder", None)
        return dec.weight.T if isinstance(getattr(dec, "weight", None), Tensor) else None

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype of the module's first float parameter (or buffer): what it computes in; None where it has none."""
        tensors = (*self.module.parameters(), *self.module.buffers())
        return next((t.dtype for t in tensors if t.is_floating_point()), None)

    def _cast(self, x: Tensor) -> Tensor:
        """x in the module's dtype (a float32 module on a bfloat16 model's output), as SparseCoder casts its input."""
        dtype = self.dtype
        return x.to(dtype) if dtype is not None and x.is_floating_point() and x.dtype != dtype else x

    def forward(self, x: Tensor) -> Tensor:
        out = self.module(self._cast(x))
        if hasattr(out, "sae_out"):
            out = out.sae_out
        elif isinstance(out, tuple | list):
            out = out[0]
        return out

    def encode(self, x: Tensor) -> Tensor:
        return self.module.encode(self._cast(x))

    def decode(self, f: Tensor) -> Tensor:
        return self.module.decode(self._cast(f))

    def check_fits(self, features: int | tuple, where: str, *, context: str = "op splice") -> None:
        n = features if isinstance(features, int) else tuple(features)[-1]
        if self.d_in is not None and n != self.d_in:
            raise ConfigError(f"{context}: the SAE {self.architecture} ({self.path or 'a module'}) reads d_in={self.d_in} "
                              f"but {where} has {n} features")


def _attr_int(module: nn.Module, *names: str, default: int | None) -> int | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) or isinstance(value, Tensor) and value.numel() == 1:
            return int(value)
    return default


def load_module(target: str | Mapping, state_dict: str | os.PathLike | None = None, *, where: str = "op splice",
                **kwargs: Any) -> ModuleCoder:
    """Build `target` (a class path, or a `_target_` node) with `kwargs`, load `state_dict` (.pt/.pth
    or .safetensors) into it, and wrap it: ModuleCoder(module).forward(x) -> x_hat."""
    from hookrun.config.build import build

    node = {"_target_": target, **kwargs} if isinstance(target, str) else {**dict(target), **kwargs}
    module = build(node, f"{where}.module")
    if not isinstance(module, nn.Module):
        raise ConfigError(f"{where}.module: {node.get('_target_')!r} built a {type(module).__name__}, not a torch.nn.Module")
    if state_dict is not None:
        file = Path(state_dict).expanduser()
        try:
            state = read_state_dict(file)
        except ConfigError as exc:
            raise ConfigError(f"{where}.state_dict: {exc}") from None
        if isinstance(state.get("state_dict"), Mapping):
            state = dict(state["state_dict"])
        expected = set(module.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ConfigError(f"{where}.state_dict: {file} does not fit {type(module).__name__}: missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}")
        try:
            module.load_state_dict(state)
        except RuntimeError as exc:  # shapes
            detail = " ".join(line.strip() for line in str(exc).splitlines()[1:3])
            raise ConfigError(f"{where}.state_dict: {file} does not fit {type(module).__name__}: {detail}") from None
    return ModuleCoder(module.eval().requires_grad_(False), str(state_dict or ""))
