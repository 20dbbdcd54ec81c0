"""Ops: tensor -> replacement tensor, used by the modify actions.

    op = build_op("scale", {"factor": 0.5}, where="hooks.z.actions.0", build=OpBuild(point, "output", env))
    new = op(tensor, ctx)

A built-in op is a name with its parameters as sibling keys of the action: a factory registered
with `@register_op(NAME)` whose parameters are the config keys, returning `op(x, ctx) -> tensor`.
A factory that needs more than its keys declares a keyword-only `build` parameter and gets the
one build context every op is made with (OpBuild: the hook point, the role family it replaces,
the run's ActionEnv); `patch` (an earlier run's file) and `splice` (a learned module) are ordinary
ops of that kind. A kind plugin declares named ops in its `ops` (config/plugins.py: the probe's
`probe_steer`, a user package's own), imported when an action first names one. A user's op is
a `_target_` callable that gets the tensor (and `ctx=` where it accepts that keyword) and returns
the replacement. `ctx` (OpContext) holds the hook name, the module's path and the module itself,
role, step, call and the batch's sample indices.
"""

from __future__ import annotations

import hashlib
import inspect
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hookrun.config.build import build as build_node
from hookrun.config.build import typed_params
from hookrun.config.plugin_parts import plugin_op, plugin_op_names
from hookrun.errors import ConfigError, NotFoundError, Registry, module_label
from hookrun.hooks import HookPoint

if TYPE_CHECKING:
    from hookrun.hooks.actions import ActionEnv

Op = Callable[[torch.Tensor, "OpContext"], torch.Tensor]


@dataclass(frozen=True)
class OpContext:
    hook: str
    target: Any  # the nn.Module (or parameter) the hook sits on
    module: str  # its path ('' is the whole model), as in `at:` and the file
    role: str
    step: int
    call: int
    sample_index: torch.Tensor | None  # dataset indices of the batch's samples
    tokens: Any = None  # the model call's TokenMap (hookrun.hooks.tokens): which tokens are real, their positions

    @property
    def module_name(self) -> str:
        """The module's path: the name `ctx.module` had before 0.2 (kept for users' ops)."""
        return self.module


@dataclass(frozen=True)
class OpBuild:
    """What an op factory may need besides its config keys (declare `*, build: OpBuild`)."""

    point: HookPoint  # the HookPoint: .hook, .type, .module (its path), .target (the nn.Module)
    family: str  # the role family the action replaces: input, output or grad_input (an event's `writable`)
    env: ActionEnv  # the run's ActionEnv: planned samples, and its hold (undone at the end of the run)

    @property
    def where(self) -> str:
        return f"hooks.{self.point.hook}"


OPS: Registry[Callable[..., Op]] = Registry("op", find=plugin_op, found_names=plugin_op_names)  # + the kinds' `ops`
register_op = OPS.register


@register_op("zero")
def zero() -> Op:
    return lambda x, ctx: torch.zeros_like(x)


@register_op("scale")
def scale(factor: float) -> Op:
    return lambda x, ctx: x * factor


@register_op("add")
def add(value: float | list, dim: int | None = None, factor: float = 1.0, *, build: OpBuild) -> Op:
    """Add `factor` times a scalar, or a vector along `dim` (default the channels: HookPoint.channel_axis)."""

    def op(x: torch.Tensor, ctx: OpContext) -> torch.Tensor:
        if isinstance(value, int | float):  # a numpy vector is a vector too, along `dim` (was numpy's broadcast: the last axis)
            return x + factor * value
        v = torch.as_tensor(value, dtype=torch.float64) * factor  # formed in float64, rounded once to x's dtype
        v = v.to(device=x.device, dtype=x.dtype if x.is_floating_point() else torch.float32)
        if v.dim() != 1:
            return x + v  # a scalar tensor, or one shaped to broadcast as it is
        axis = build.point.channel_axis(x, ctx.role) if dim is None else dim  # a 1-D one lies along `dim`
        if len(v) not in (1, x.shape[axis]):  # PyTorch's "size of tensor a (5) must match ... b (128)" names neither
            fit = [f"dim: {d - x.dim()}" for d in range(x.dim()) if x.shape[d] == len(v)][-1:] or [f"{x.shape[axis]} entries"]
            raise ConfigError(f"{build.where}: op add at {module_label(ctx.module)}: value has {len(v)} entries but dim {axis} of the {ctx.role} {tuple(x.shape)} has {x.shape[axis]}; give {fit[0]}")
        return x + v.view([-1 if d == axis % x.dim() else 1 for d in range(x.dim())])

    return op


@register_op("noise")
def noise(std: float, seed: int = 0) -> Op:
    """Add Gaussian noise drawn from generators seeded by _mix(seed, salt, ...), salt the crc32 of
    'hook/module/role/call': a (batch, tokens, ...) tensor of the model call's tokens gets a draw per
    token, keyed by (sample index, the token's position among its sample's real tokens; padding: 'pad',
    its column), so a generated token gets its own draw and batch size and padding side change no
    token's noise; another tensor a draw per sample (sample index), or per batch (step)."""
    if not std >= 0:  # (NaN too)
        raise ConfigError(f"op noise: std={std} is a standard deviation; give a number >= 0")

    def op(x: torch.Tensor, ctx: OpContext) -> torch.Tensor:
        salt = zlib.crc32(f"{ctx.hook}/{ctx.module}/{ctx.role}/{ctx.call}".encode())
        g = torch.Generator(device=x.device)

        def draw(*key: object, shape: torch.Size) -> torch.Tensor:
            g.manual_seed(_mix(seed, salt, *key))
            return torch.randn(shape, generator=g, device=x.device, dtype=x.dtype)

        index = ctx.sample_index
        if index is None or x.dim() == 0 or x.shape[0] != len(index):
            return x + std * draw(ctx.step, shape=x.shape)
        valid = getattr(ctx.tokens, "valid", None)
        if valid is not None and x.dim() >= 2 and tuple(x.shape[:2]) == tuple(valid.shape):  # per token
            valid, position = valid.tolist(), ctx.tokens.position.tolist()
            rows = [draw(int(i), position[b][j], shape=x.shape[2:]) if valid[b][j] else draw(int(i), "pad", j, shape=x.shape[2:])
                    for b, i in enumerate(index.tolist()) for j in range(x.shape[1])]
            return x + std * torch.stack(rows).view(x.shape)
        return x + std * torch.stack([draw(int(i), shape=x.shape[1:]) for i in index.tolist()])

    return op


def _mix(*parts: int) -> int:
    """A 63-bit generator seed from the parts (stable across runs and machines)."""
    return int.from_bytes(hashlib.blake2b(",".join(map(str, parts)).encode(), digest_size=8).digest(), "little") >> 1


@register_op("clamp")
def clamp(min: float | None = None, max: float | None = None) -> Op:  # noqa: A002 (config names)
    if min is None and max is None:
        raise ConfigError("op clamp needs min, max or both")
    if min is not None and max is not None and min > max:  # (torch would set every value to max)
        raise ConfigError(f"op clamp: min={min} is above max={max}; give min <= max")
    return lambda x, ctx: x.clamp(min=min, max=max)


@register_op("mask")
def mask(index: int | list[int], dim: int | None = None, *, build: OpBuild) -> Op:
    """Zero the listed channels (default: HookPoint.channel_axis) or positions along `dim` (0: the batch)."""
    idx = [index] if isinstance(index, int) else list(index)

    def op(x: torch.Tensor, ctx: OpContext) -> torch.Tensor:
        out = x.clone()
        out.index_fill_(build.point.channel_axis(x, ctx.role) if dim is None else dim, torch.as_tensor(idx, device=x.device), 0)
        return out

    return op


@register_op("mean")
def mean() -> Op:
    """Replace every sample by the batch mean (mean ablation); a padded prompt's token rows: each real token by the mean
    of the batch's real tokens at its position, padding as it was; generate's new token: the unfinished samples' mean."""

    def op(x: torch.Tensor, ctx: OpContext) -> torch.Tensor:
        t, valid = ctx.tokens, getattr(ctx.tokens, "valid", None)
        if valid is None or tuple(x.shape[:2]) != tuple(valid.shape) or bool(valid.all()) or not bool(valid.any()):
            return x.mean(dim=0, keepdim=True).expand_as(x).clone()
        valid, pos = valid.to(x.device), t.position.to(x.device)[valid.to(x.device)] * (not (t.call or t.generated))
        sums = torch.zeros((int(pos.max()) + 1, *x.shape[2:]), dtype=torch.float64, device=x.device)
        sums.index_add_(0, pos, x[valid].double())
        counts = torch.bincount(pos).view(-1, *[1] * (x.dim() - 2))
        out = x.clone()
        out[valid] = (sums / counts)[pos].to(x.dtype)
        return out

    return op


@register_op("constant")
def constant(value: float) -> Op:
    return lambda x, ctx: torch.full_like(x, value)


def _features(features: Any, op: str, values: bool = True) -> tuple[list[int], list[float]]:
    """`features: {123: 4.0, 7: 0.5}` (or a list, for zero_features): feature indices on the last dim."""
    if not values and isinstance(features, list | tuple):
        idx, vals = list(features), [0.0] * len(features)
    elif isinstance(features, Mapping) and features:
        idx, vals = list(features), list(features.values())
    else:
        form = "[3, 17]" if not values else "{123: 4.0}"
        raise ConfigError(f"op {op}: features must be {'a list or ' if not values else ''}a mapping of feature index to "
                          f"value, e.g. features: {form}; got {features!r}")
    if not idx or any(isinstance(i, bool) for i in idx):
        raise ConfigError(f"op {op}: features {features!r}: give one or more feature indices (whole numbers)")
    try:
        idx, vals = [int(i) for i in idx], [float(v) for v in vals]
    except (TypeError, ValueError):
        raise ConfigError(f"op {op}: features {features!r}: indices must be integers and values numbers") from None
    if min(idx) < 0:  # Python's negative index would edit a feature counted from the end
        raise ConfigError(f"op {op}: feature {min(idx)} is negative; feature indices count from 0")
    return idx, vals


def _feature_op(features: Any, name: str, apply: Callable, build: OpBuild | None, values: bool = True) -> Op:
    idx, vals = _features(features, name, values)
    width = getattr(build.point.target, "width", None) if build is not None else None  # an SAE's latents: d_sae
    if isinstance(width, int) and max(idx) >= width:
        raise ConfigError(f"{build.where}: op {name} at {build.point.module}: feature {max(idx)} does not exist; "
                          f"the SAE has d_sae={width} features (0 to {width - 1})")

    def op(x: torch.Tensor, ctx: OpContext) -> torch.Tensor:
        if max(idx) >= x.shape[-1]:
            raise ConfigError(f"op {name} at {module_label(ctx.module)}: feature {max(idx)} is past the last dim's "
                              f"{x.shape[-1]} features (shape {tuple(x.shape)})")
        out = x.clone()
        i = torch.as_tensor(idx, device=x.device)
        wide = torch.promote_types(x.dtype, torch.float32) if x.is_floating_point() else x.dtype  # a half x: the op in
        out[..., i] = apply(out[..., i], torch.as_tensor(vals, dtype=wide, device=x.device)).to(x.dtype)  # float32, rounded once
        return out

    return op


@register_op("zero_features")
def zero_features(features: Any, *, build: OpBuild | None = None) -> Op:
    """Zero the listed features of the last dim (an SAE's latents: `features: [3, 17]`)."""
    return _feature_op(features, "zero_features", lambda cur, v: torch.zeros_like(cur), build, values=False)


@register_op("scale_features")
def scale_features(features: Any, *, build: OpBuild | None = None) -> Op:
    """Multiply each listed feature of the last dim by its value (`features: {3: 0.5}`)."""
    return _feature_op(features, "scale_features", lambda cur, v: cur * v, build)


@register_op("clamp_features")
def clamp_features(features: Any, *, build: OpBuild | None = None) -> Op:
    """Set each listed feature of the last dim to its value at every position (`features: {123: 8.0}`)."""
    return _feature_op(features, "clamp_features", lambda cur, v: v.expand_as(cur).clone(), build)


@register_op("add_features")
def add_features(features: Any, *, build: OpBuild | None = None) -> Op:
    """Add its value to each listed feature of the last dim. On an SAE's latents (MODULE.sae.latents)
    this steers: the reconstruction moves by value x the feature's decoder direction."""
    return _feature_op(features, "add_features", lambda cur, v: cur + v, build)


def build_op(op: Any, params: Mapping, where: str, build: OpBuild | None = None) -> Op:
    """An Op from a name with params, or a `_target_` node; a factory with a keyword-only `build` gets `build`."""
    if isinstance(op, Mapping):
        if params:
            raise ConfigError(f"{where}: with op: {{_target_: ...}}, put the op's arguments inside the op node, not {sorted(params)}")
        fn = build_node(op, f"{where}.op")
        if not callable(fn):
            raise ConfigError(f"{where}.op: {op['_target_']!r} built a {type(fn).__name__}, not a callable (add `_partial_: true` for a function)")
        return _user_op(fn)
    if not isinstance(op, str):
        raise ConfigError(f"{where}.op: expected an op name or a `_target_` node, got {op!r}")
    factory, params, takes_build = op_params(op, params, where)
    if takes_build:
        if build is None:
            raise ConfigError(f"{where}: op {op} needs a hook point to be built (it is made by a modify action)")
        return factory(**params, build=build)
    return factory(**params)


def op_params(op: str, params: Mapping, where: str) -> tuple[Callable[..., Op], dict, bool]:
    """A named op's factory, its params checked (keys, numbers) and whether it takes `build`: no model needed."""
    try:
        factory = OPS.get(op)
    except (NotFoundError, ConfigError) as exc:  # (a plugin's import path that names nothing: ConfigError)
        raise ConfigError(f"{where}.op: {exc}") from None
    if OPS.own(op) and op in plugin_op_names():  # which of the two is meant cannot be told
        raise ConfigError(f"{where}.op: {op!r} is one of hookrun's own ops, and a kind plugin declares an op "
                          f"{op!r} in its `ops` too; give the plugin's op another name")
    keys = set(sig := inspect.signature(factory).parameters) - {"self", "build"}
    if unknown := sorted(set(params) - keys):
        raise ConfigError(f"{where}: op {op} has no parameter {', '.join(unknown)}; its parameters: {', '.join(sorted(keys)) or 'none'}")
    if missing := [n for n, p in sig.items() if p.default is p.empty and n not in params and n != "build"]:
        raise ConfigError(f"{where}: op {op} needs {', '.join(missing)} (e.g. {{name: ..., op: {op}, {missing[0]}: ...}})")
    return factory, typed_params(factory, params, where), "build" in sig and sig["build"].kind is sig["build"].KEYWORD_ONLY


def _user_op(fn: Callable) -> Op:
    try:
        takes_ctx = "ctx" in inspect.signature(fn).parameters or any(
            p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        takes_ctx = False
    return (lambda x, ctx: fn(x, ctx=ctx)) if takes_ctx else (lambda x, ctx: fn(x))

