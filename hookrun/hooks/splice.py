"""Splice: a learned module (an SAE, a transcoder, any nn.Module) replaces a module's output.

    hooks:
      sae: {at: transformer.h.1, type: forward, actions: [{name: modify_output, op: splice, path: saes/h1}]}
      lat: {at: transformer.h.1.sae.latents, type: forward, actions: [{name: record, what: output, rows: token}]}

`install` (make_plan calls it before any point is planned) loads each splice's module (sae/readers.py
reads SAELens, sparsify and dictionary_learning folders; `module: {_target_: ...}` + `state_dict:`
builds any nn.Module) and adds it to the model as a child `sae` of the module it splices. So
`MODULE.sae.latents` (the SAE's latents, after its activation) and `MODULE.sae.reconstruction`
(its x_hat) are module paths like any other: recorded, modified (zero_features, scale_features,
clamp_features, add_features), listed. The op `splice` then calls that child on the output x:

    f = encode(x); g = latents(f)           (hooks on MODULE.sae.latents may edit g)
    y = reconstruction(decode(g))           (the module's new output)
    error_term: true   ->  y = x + (decode(g) - decode(f))   (x itself where nothing was edited)

An nn.Sequential spliced at runs every child in order, `sae` too: called so, the child passes the output
through untouched there (no hook fires; a forward pre-hook on the module marks its forward), and only
the op splices (Splice.splice_output).

A feature map (B, C, H, W) whose channels are the SAE's d_in (the sae kind's rows: channel) is spliced at
each position's channel vector (channels_first; a map as wide as it has channels too): its latents are
(B, H, W, d_sae).

An SAE folder that names the module it was trained on (cfg.json hook_name) is refused at another module
of the same model unless the action says `other_module: true`.

Every spliced forward adds to Splice.stats (float64, padding excluded): l0, mse, explained
variance, dead latents; a kind that measures splices reads them (env.splices). The children are removed at
the end of the run (env.hold): the model comes back as it went in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from hookrun.config.build import typed_params
from hookrun.errors import ConfigError, module_label
from hookrun.hooks import family
from hookrun.hooks.ops import OpBuild, OpContext, register_op
from hookrun.sae.module_coder import load_module
from hookrun.sae.readers import check_finite_weights, load_sae
from hookrun.sae.splice_stats import SpliceStats

if TYPE_CHECKING:
    from hookrun.hooks.actions import ActionEnv

log = logging.getLogger("hookrun")
CHILD = "sae"  # MODULE.sae is the spliced module; MODULE.sae.latents and .reconstruction its hook points


class Tap(nn.Identity):
    """An identity: a named place in the forward for hooks (TransformerLens' HookPoint); `width`:
    the size of its tensor's last dim where it is known before any batch (an SAE's d_sae). `output_fmt`
    NHWC (points.channels_last): its 4-D tensors are a map's positions with the SAE's vectors last."""

    def __init__(self, width: int | None = None, output_fmt: str | None = None) -> None:
        super().__init__()
        self.width, self.output_fmt = width, output_fmt

    def forward(self, x: Tensor) -> Tensor:
        return x


class Splice(nn.Module):
    """The learned module spliced into MODULE's output, with its hook points and statistics."""

    passes_through = True  # an nn.Sequential's last child that hands its output on: its layout is the one before (points)

    def __init__(self, coder: nn.Module, module: str, error_term: bool, state: Any) -> None:
        super().__init__()
        self.coder = coder
        self.module, self.error_term, self.state = module, bool(error_term), state
        self.codes = bool(getattr(coder, "has_encode", True))  # encode/decode (an SAE), or only forward
        if self.codes:
            d_sae = getattr(coder, "d_sae", None)
            self.latents = Tap(d_sae if isinstance(d_sae, int) else None, "NHWC")  # (B, H, W, d_sae) of a map
        # a map's reconstruction is (B, H, W, C) too, spliced at each position's channels; a hook_z SAE's is (B, T, H, d_head)
        self.reconstruction = Tap(output_fmt=None if getattr(coder, "reshape", None) == "hook_z" else "NHWC")
        self.stats = SpliceStats(getattr(coder, "d_sae", None))
        self.in_parent = False  # True from the spliced module's forward pre-hook until the op splices

    def parent_starts(self, module: nn.Module, args: Any) -> None:
        self.in_parent = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # a module that runs its children in order (an nn.Sequential spliced at) calls its new `sae` child as a
        # last layer in its forward: it passes the output through there (no hook fires), and the op splices
        if self.in_parent:
            return args[0] if args else next(iter(kwargs.values()))
        return super().__call__(*args, **kwargs)

    def splice_output(self, x: Tensor) -> Tensor:
        self.in_parent = False
        return self(x)

    def forward(self, x: Tensor) -> Tensor:
        coder = self.coder
        if self.codes:
            f = coder.encode(x)
            clean = coder.decode(f)  # (before the latents' hooks: one may edit them in place and hand them back)
            hooked = bool(self.latents._forward_hooks or self.latents._forward_pre_hooks)
            g = self.latents(f.clone() if hooked else f)  # hooked: a copy to edit, and in the graph of y
            y = clean if g is f else coder.decode(g)
        else:
            f = None
            clean = y = coder(x)
        y = self.reconstruction(y)
        if self.stats.enabled:
            self.stats.add(x, clean, f, self._valid(x))
        if self.error_term:  # the model's own output, plus what the edits changed
            return x if y is clean else x + (y - clean).to(x.dtype)
        return y.to(x.dtype)

    def _valid(self, x: Tensor) -> Tensor | None:
        """(B, T) real tokens where x is (B, T, ...) of this call's attention mask, else None (every row)."""
        tokens = getattr(self.state, "call_tokens", None)
        valid = getattr(tokens, "valid", None)
        if valid is not None and x.dim() >= 3 and tuple(x.shape[:2]) == tuple(valid.shape):
            return valid
        return None


def coder_of(params: Mapping, where: str, device: Any = None) -> nn.Module:
    """The learned module an action's `path:` or `module:` (+ `state_dict:`) names."""
    path, module = params.get("path"), params.get("module")
    if (path is None) == (module is None):
        raise ConfigError(f"{where}: op splice needs path: DIR (an SAELens, sparsify or dictionary_learning folder) "
                          f"or module: {{_target_: ...}} with state_dict: FILE; give one of them")
    if path is not None:
        return load_sae(str(path), device=device, dtype=params.get("dtype"), where=where)
    if params.get("dtype") is not None:
        raise ConfigError(f"{where}: dtype is for path: (an SAE folder); a module: is used as it is built")
    coder = load_module(module, params.get("state_dict"), where=where)
    check_finite_weights(coder, f"{where}: the module {module.get('_target_') if isinstance(module, Mapping) else module!r}")
    return coder.to(device)


def install(model: nn.Module, specs: list, env: ActionEnv, targets: Callable[[Any], list]) -> None:
    """Add a Splice child to every module a `modify_output` with `op: splice` names; record each in
    env.splices, and the removal of each with env.hold (ModelHold, hooks/actions/__init__.py)."""
    for spec in specs:
        for action in spec.actions:
            if action.is_target or action.params.get("op") != "splice":
                continue
            if action.name != "modify_output" or spec.type != "forward":
                raise ConfigError(f"{action.where}: op splice replaces a module's output: use it in "
                                  f"{{name: modify_output, op: splice}} on a hook of type: forward")
            coder = None
            for name, target, site in targets(spec):
                if site is not None or not isinstance(target, nn.Module):
                    raise ConfigError(f"{action.where}: op splice replaces a module's output; {name} is an op site "
                                      f"(splice the module {module_label(name.split('/')[0])} instead)")
                if CHILD in target._modules or hasattr(target, CHILD):
                    raise ConfigError(f"{action.where}: {module_label(name)} already has an attribute {CHILD!r}: "
                                      f"one splice per module")
                if coder is None:
                    device = next((p.device for p in target.parameters()), None)
                    coder = coder_of(action.params, action.where, device)
                    say_cast(coder, target, f"{action.where}: op splice at {module_label(name)}")
                given = typed_params(splice, action.params, action.where)
                check_module(model, coder, name, action.where, given.get("other_module", False), action.params.get("arg"))
                error_term = given.get("error_term", False)
                spliced = Splice(coder, name, error_term, env.state)
                target.add_module(CHILD, spliced)
                env.splices.append(spliced)
                env.hold.on_close(_remover(target, spliced, env, target.register_forward_pre_hook(spliced.parent_starts)))


def say_cast(coder: nn.Module, target: nn.Module, where: str) -> None:
    """One log line where the learned module computes in another dtype than the module it splices (a float32
    SAE or module on a bfloat16 model): its input is cast to its dtype, its reconstruction back to the model's."""
    mine = getattr(coder, "dtype", None)
    theirs = next((p.dtype for p in target.parameters() if p.is_floating_point()), None)
    if isinstance(mine, torch.dtype) and theirs is not None and mine != theirs:
        what = f"module {coder.architecture}" if getattr(coder, "source", None) == "module" else \
            f"SAE in {getattr(coder, 'path', '') or '(memory)'}"
        a, b = str(mine).removeprefix("torch."), str(theirs).removeprefix("torch.")
        log.info("%s: the %s computes in %s on the model's %s output (cast to %s on the way in, its reconstruction "
                 "cast back to %s)", where, what, a, b, a, b)


def check_module(model: nn.Module, coder: nn.Module, name: str, where: str, other_module: bool, arg: Any = None) -> None:
    """An SAE whose recorded module (cfg.json hook_name) is another module of this model is refused at `name`
    unless other_module: true (a name the model lacks, such as a TransformerLens hook on a transformers model,
    says nothing here); so is one the sae kind trained on another tensor of a module (hook_name MODULE/ROLE:
    its input, a gradient), but for MODULE/output.N spliced at MODULE with arg: N."""
    trained = getattr(coder, "hook_name", None)
    modules = dict(model.named_modules())
    module, _, role = (trained or "").rpartition("/")  # the sae kind's MODULE/ROLE: trained on another of its tensors
    ours = module == name and arg is not None and role == f"output.{arg}"  # (a tuple's part, spliced with arg)
    if not (other_module or ours) and module in modules and trained not in modules and role.startswith(("input", "output", "grad")):
        raise ConfigError(f"{where}: op splice at {module_label(name)}: the SAE in {getattr(coder, 'path', '') or 'module'} "
                          f"was trained on {module_label(module)}'s {role} (its hook_name {trained}), not on the output "
                          "op splice replaces; splice it at a module whose output that tensor is, or give other_module: "
                          "true to splice it here anyway")
    if other_module or not trained or trained == name or trained not in modules:
        return
    raise ConfigError(f"{where}: op splice at {module_label(name)}: the SAE in {getattr(coder, 'path', '') or 'module'} "
                      f"was trained on {module_label(trained)} (its hook_name), not {module_label(name)}; splice it at "
                      f"{trained}, or give other_module: true to splice it here anyway")


def _remover(target: nn.Module, splice: Splice, env: ActionEnv, handle: Any) -> Callable[[], None]:
    def remove() -> None:
        handle.remove()
        if target._modules.get(CHILD) is splice:
            del target._modules[CHILD]
        if splice in env.splices:
            env.splices.remove(splice)
    return remove


def channels_first(x: Tensor, coder: nn.Module, last: bool = False, tokens: Any = None) -> bool:
    """Whether an SAE reads `x` (B, C, H, W) at its channels: a feature map whose channels are the SAE's
    d_in, as the sae kind's `rows: channel` trains it (a hook_z SAE reads the last two dims). Where its
    last dim is d_in too (8 channels, 8 wide), the module decides: a map's channels, unless its output is
    channels last (`last`: HookPoint.last) or `x` runs over the call's tokens (`tokens`: its TokenMap)."""
    d_in = getattr(coder, "d_in", None)
    if not (x.dim() == 4 and getattr(coder, "reshape", None) != "hook_z" and isinstance(d_in, int) and x.shape[1] == d_in):
        return False
    if x.shape[-1] != d_in:
        return True
    valid = getattr(tokens, "valid", None)
    return not last and not (valid is not None and tuple(x.shape[:2]) == tuple(valid.shape))


@register_op("splice")
def splice(path: str | None = None, module: Any = None, state_dict: str | None = None, error_term: bool = False,
           dtype: str | None = None, other_module: bool = False, *, build: OpBuild) -> Callable[[Tensor, OpContext], Tensor]:
    """The output of MODULE through the learned module `install` spliced in (see the module doc)."""
    target = build.point.target
    spliced = getattr(target, "_modules", {}).get(CHILD)
    if not isinstance(spliced, Splice):
        raise ConfigError(f"{build.where}: op splice replaces a module's output: use it in "
                          f"{{name: modify_output, op: splice}} on a hook of type: forward")
    where = f"{build.where}: op splice at {module_label(build.point.module)}"

    def op(x: Tensor, ctx: OpContext) -> Tensor:
        if not torch.is_floating_point(x):
            raise ConfigError(f"{where}: the output {ctx.role} is {x.dtype}, not a float tensor to reconstruct")
        last = family(ctx.role) in build.point.last
        if channels_first(x, spliced.coder, last, ctx.tokens):  # a feature map's channel vector at each position (sae rows: channel)
            return spliced.splice_output(x.movedim(1, -1)).movedim(-1, 1)
        spliced.coder.check_fits(tuple(x.shape), f"{module_label(build.point.module)}'s {ctx.role}", context=where)
        return spliced.splice_output(x)

    return op


def check_outputs(points: list, run_one: Callable[[], Any]) -> None:
    """Before the first batch: run one sample (run_one) with a plain forward hook on every spliced
    module and refuse, in one line, an output that is not a tensor to splice or whose width is not
    the SAE's d_in (the op would fail at batch 0 otherwise)."""
    spliced = [(p, a) for p in points for a in p.actions if getattr(a, "op_name", None) == "splice"]
    if not spliced:
        return
    seen: dict[int, Any] = {}

    def keep(key: int) -> Callable:
        def hook(module: nn.Module, args: Any, out: Any) -> None:  # returns None: the output stays as it is
            seen.setdefault(key, out)
        return hook

    handles = [p.target.register_forward_hook(keep(id(p))) for p, _ in spliced]
    try:
        run_one()
    finally:
        for h in handles:
            h.remove()
    for p, action in spliced:
        out = seen.get(id(p))
        name = module_label(p.module)
        if id(p) not in seen:
            continue  # never ran on this sample: the end report lists it
        if isinstance(out, tuple | list) and action.arg is None:
            kinds = ", ".join(type(v).__name__ for v in out)
            raise ConfigError(f"{action.where}: op splice at {name}: its output is a tuple ({kinds}); splice one tensor "
                              f"of it with arg: 0")
        value = out[action.arg] if isinstance(out, tuple | list) and isinstance(action.arg, int) and action.arg < len(out) else out
        if not isinstance(value, Tensor):
            raise ConfigError(f"{action.where}: op splice at {name}: its output is a {type(value).__name__}, not a tensor "
                              f"(splice a module that returns its activations as a tensor)")
        coder = p.target._modules[CHILD].coder
        if not channels_first(value, coder, "output" in p.last):
            coder.check_fits(tuple(value.shape), f"{name}'s output", context=f"{action.where}: op splice")
