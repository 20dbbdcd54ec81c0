"""The model as captum calls it: the attributed input first, the call's other batched tensors after it,
the target's logits out.

    f = Forward(model, call)          # call: a batch's ModelCall (runner/calls.py)
    logits = f(f.input, *f.extras)    # (n, classes): a token model's at each item's last real token

`f.watch = x` keeps the logits of the first call on that very tensor (`f.seen`): the methods' own
forward of the unperturbed inputs gives the model's logits without a forward of their own.
The attributed input is the call's first positional tensor, else its `input_ids` keyword, else its
first tensor keyword. The other tensors whose first axis is the batch's go to captum as
`additional_forward_args`, so that it repeats them with the interpolation steps and occluded copies.
A sequence's logits (n, positions, classes) are read at each item's last real token: the last 1 of
its `attention_mask` (the call's `attention_mask` keyword, else the batch's mask, which then rides
along as a hidden extra the model is not given), the last position where there is no mask; right
padding would otherwise attribute the prediction at a padding token.

LRP (below): layer-wise relevance propagation by zennit, its Gradient attributor with a named
composite, on a copy of the model (zennit's canonizers merge batch norms into the convolutions of the
model they run on, leaving a zero `bias` parameter on each: the user's model must come back as it
went in). `LRP(model, "epsilon_plus_flat").attribute(x, target, classes)`; refused in one line where
zennit cannot canonize the model, or where the composite has no rule for one of its modules (a
LayerNorm, attention, parameters of a container's own: check_rules, below). Canonizers: torchvision's ResNets (BasicBlock / Bottleneck) get
zennit's ResNetCanonizer (batch norms merged, the skip connection's sum made a module); other models
with batch norm get SequentialMergeBatchNorm, which merges a batch norm that directly follows a
convolution or linear layer; a model with no batch norm needs none. epsilon_gamma_box's box rule
(zennit's ZBox, on the first convolution) takes `low` and `high`: numbers, or one per channel, given
to zennit as a (1, C) tensor that it extends to the input's (n, C, ...). deconvnet, guided_backprop
and beta_smooth change only the gradient of nn.ReLU modules (a model without them is refused).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError
from hookrun.runner.token_inputs import with_positions


class Forward:
    def __init__(self, model: nn.Module, call: Any) -> None:
        self.model = model
        args, kwargs = list(call.args), dict(call.kwargs)
        if args and isinstance(args[0], torch.Tensor):
            self.slot: int | str = 0
        else:
            names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
            if not names:
                raise ConfigError(f"attribution: the forward call ({call.describe()}) passes no tensor to attribute to")
            self.slot = "input_ids" if "input_ids" in names else names[0]
        self.input = args[0] if self.slot == 0 else kwargs[self.slot]
        n = self.input.shape[0] if self.input.dim() else 0
        batched = lambda v: isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n  # noqa: E731
        self.places = [i for i, v in enumerate(args) if i != self.slot and batched(v)]
        self.places += [k for k, v in kwargs.items() if k != self.slot and batched(v)]
        self.extras = tuple(args[p] if isinstance(p, int) else kwargs[p] for p in self.places)
        mask = getattr(call, "attention_mask", None)
        if MASK not in self.places and MASK != self.slot and batched(mask):  # the batch's mask, not passed to the model
            self.places.append(HIDDEN)
            self.extras += (mask,)
        self.model_extras = len(self.places) - (HIDDEN in self.places)  # the tensors the model itself takes beside x
        self.args, self.kwargs = args, kwargs
        self.watch: torch.Tensor | None = None  # the batch's own input: its logits are kept when captum runs it
        self.seen: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, *extras: torch.Tensor) -> torch.Tensor:
        args, kwargs = list(self.args), dict(self.kwargs)
        mask = None  # (the model gets its own x: it may change it in place, x.sub_(mean), and x is forwarded again)
        for place, value in ((self.slot, x.clone()), *zip(self.places, extras, strict=True)):
            if place == HIDDEN:
                mask = value
            elif isinstance(place, int):
                args[place] = value
            else:
                kwargs[place] = value
        logits = logits_of(self.model(*args, **with_positions(self.model, kwargs, kwargs.get(MASK))), kwargs.get(MASK, mask))
        if x is self.watch and self.seen is None:  # captum's own forward of the inputs (occlusion's first, IG's delta)
            self.seen = logits.detach()
        return logits


MASK, HIDDEN = "attention_mask", -1  # HIDDEN: the place of a mask that rides with the extras, not passed to the model


def logits_of(out: Any, mask: Any = None) -> torch.Tensor:
    """The classes' logits of a model's output: a tensor (n, classes); `.logits` or the first item of a
    tuple; a sequence's (n, positions, classes) at each item's last real token, the last nonzero entry
    of `mask` (n, positions) (left padding: the last position; no mask, or none that fits: the last
    position)."""
    if not isinstance(out, torch.Tensor):
        out = getattr(out, "logits", None) if not isinstance(out, tuple | list) else out[0]
    if not isinstance(out, torch.Tensor) or out.dim() not in (2, 3):
        raise ConfigError("attribution: the model's output is not logits (n, classes) or (n, positions, classes); "
                          "attribution needs a classifier's or a language model's logits")
    if out.dim() == 2:
        return out
    n, t = out.shape[:2]
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (n, t):
        return out[:, -1]
    real = mask.to(out.device) != 0
    last = (real.long() * torch.arange(1, t + 1, device=out.device)).argmax(1)  # the last real position
    last = torch.where(real.any(1), last, t - 1)
    return out[torch.arange(n, device=out.device), last]


BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


# zennit's composites that change only the ReLUs' gradients (every other module keeps its gradient):
# no LRP rule is missing where they give none, but a model without nn.ReLU modules gets the plain gradient
GRADIENT_COMPOSITES = ("deconvnet", "guided_backprop", "beta_smooth")


class LRP:
    def __init__(self, model: nn.Module, composite: str, low: Any = None, high: Any = None) -> None:
        """`low`, `high`: epsilon_gamma_box's box range (numbers, or lists: one per channel)."""
        from zennit.composites import COMPOSITES

        self.model = copy.deepcopy(model).eval()
        for m in self.model.modules():  # (the copy: an in-place ReLU overwrote the input beta_smooth's rule keeps)
            if isinstance(getattr(m, "inplace", None), bool):
                m.inplace = False
        self.canonizers = canonizers_for(self.model)
        box = {}
        if low is not None and high is not None:  # (block.py allows them with epsilon_gamma_box only)
            box = {"low": bound(low), "high": bound(high)}
        self.composite = COMPOSITES[composite](canonizers=self.canonizers, **box)
        check_rules(self.model, self.composite, composite)

    def counted(self, model: nn.Module, forward: Any) -> Any:
        """`forward()` (the first batch's, of the user's `model`) with a count of each call of the modules whose
        rule keeps their input (zennit's BasicHook rules, ReLUBetaSmooth): the rule holds one input per module,
        so of a module that runs twice every call but the last would be attributed with the last call's input
        (a convolution used twice: 70% off zennit's LRP on an untied copy). More than one call is refused."""
        from zennit.core import Hook

        ctx: dict = {}
        rules = {path: self.composite.module_map(ctx, path, m) for path, m in self.model.named_modules()}
        paths = [path for path, rule in rules.items() if rule is not None and type(rule).forward is not Hook.forward]
        calls: dict[str, int] = {}
        handles = [model.get_submodule(p).register_forward_hook(lambda m, i, o, p=p: calls.__setitem__(p, calls.get(p, 0) + 1))
                   for p in paths if not isinstance(model.get_submodule(p), BATCH_NORMS)]
        try:
            out = forward()
        finally:
            for h in handles:
                h.remove()
        twice = next(((p, n) for p, n in calls.items() if n > 1), None)
        if twice:
            raise ConfigError(f"attribution.method=lrp: {twice[0]} runs {twice[1]} times in one forward (a shared or "
                              f"looped layer), and zennit's rule keeps one input per module, so its earlier calls would "
                              f"be attributed with its last call's input; give each use a module of its own, or use "
                              f"another method (integrated_gradients)")
        return out

    def attribute(self, x: torch.Tensor, target: torch.Tensor, classes: int) -> torch.Tensor:
        from zennit.attribution import Gradient

        one_hot = torch.nn.functional.one_hot(target, classes).to(x.dtype)
        with Gradient(model=self.model, composite=self.composite) as attributor:
            _, relevance = attributor(x.detach().clone(), one_hot)
        return relevance


def bound(value: Any) -> Any:
    """A box bound as zennit's ZBox broadcasts it: a number, or per channel (1, C), which it extends
    with trailing axes to the input's (n, C, H, W)."""
    return torch.tensor(value, dtype=torch.float32)[None] if isinstance(value, list) else float(value)


def canonizers_for(model: nn.Module) -> list:
    """The zennit canonizers a model needs, checked on it: every batch norm must be merged."""
    from torchvision.models.resnet import BasicBlock, Bottleneck
    from zennit.canonizers import SequentialMergeBatchNorm
    from zennit.torchvision import ResNetCanonizer

    norms = [name for name, m in model.named_modules() if isinstance(m, BATCH_NORMS)]
    if not norms:
        return []
    resnet = any(isinstance(m, BasicBlock | Bottleneck) for m in model.modules())
    canonizer = ResNetCanonizer() if resnet else SequentialMergeBatchNorm()
    probe = copy.deepcopy(model)  # (applied and removed on a copy: it changes what it merges)
    instances = canonizer.apply(probe)
    merged = {id(getattr(i, "batch_norm", None)) for i in instances}
    left = [name for name, m in probe.named_modules() if isinstance(m, BATCH_NORMS) and id(m) not in merged]
    for i in instances:
        i.remove()
    if left:
        raise ConfigError(f"attribution.method=lrp: zennit cannot canonize {type(model).__name__}: its batch norm(s) "
                          f"{', '.join(left[:4])}{' ...' if len(left) > 4 else ''} do not directly follow a convolution or "
                          f"linear layer, so zennit's canonizers cannot merge them; use another method (integrated_gradients)")
    return [canonizer]


# no parameters of their own, but not linear either: no rule of zennit's composites covers them
NONLINEAR = (nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LocalResponseNorm,
             nn.RMSNorm, nn.Softmax, nn.Softmax2d, nn.LogSoftmax, nn.Softmin)


def check_rules(model: nn.Module, composite: Any, name: str) -> None:
    """Refuse a model with modules the composite gives no rule to (zennit would pass them the plain
    gradient, and the relevances would no longer be LRP's: a ViT's sums run from 672 to -412,416):
    a module with parameters of its own, a normalization or softmax, or attention (softmax(QK)V has
    no rule in zennit, whatever its projections get; zennit gives nn.MultiheadAttention the
    pass-through it gives activations, its weights unused). Containers, activations, pooling,
    Dropout, Flatten and Identity need none. The rules are what the composite's `module_map` gives
    each module, as zennit's Composite.register asks it; a batch norm the canonizers merged is an
    identity and needs none. deconvnet, guided_backprop and beta_smooth are modified gradients, not LRP:
    only their ReLUs' rule matters, and a model without nn.ReLU modules is refused (the plain gradient)."""
    ctx: dict = {}
    missing: dict[str, list[str]] = {}
    if name in GRADIENT_COMPOSITES:  # a modified gradient, not LRP: the other modules' gradient is the method's
        if not any(composite.module_map(ctx, path, m) is not None for path, m in model.named_modules()):
            raise ConfigError(f"attribution.method=lrp: the composite {name} changes the gradient of torch.nn.ReLU "
                              f"modules, and {type(model).__name__} has none (a functional relu is no module): it would "
                              f"give the plain gradient; use method=saliency, or a model with nn.ReLU modules")
        return
    merged = bool(getattr(composite, "canonizers", None))  # canonizers_for: every batch norm merged (an identity)
    for path, module in model.named_modules():
        rule = composite.module_map(ctx, path, module)
        if merged and isinstance(module, BATCH_NORMS):  # (excitation_backprop gives batch norms no rule)
            continue
        own = next(module.parameters(recurse=False), None) is not None
        attention = "attention" in type(module).__name__.lower()
        if attention or (rule is None and (own or isinstance(module, NONLINEAR))):
            own_only = own and not attention and not isinstance(module, NONLINEAR) and next(module.children(), None)
            label = f"{path or 'the model'}'s {', '.join(n for n, _ in module.named_parameters(recurse=False))}" \
                if own_only else path
            missing.setdefault(type(module).__name__, []).append(label)
    if name == "epsilon_gamma_box" and not ctx.get("first_layer_visited"):  # (zennit's first_map: a convolution)
        raise ConfigError(f"attribution.composite=epsilon_gamma_box: its box rule goes on the first convolution, and "
                          f"{type(model).__name__} has none (low and high would go unused); use composite=epsilon_plus, "
                          f"whose rules are the same on a model without convolutions")
    if missing:
        listed = ", ".join(f"{kind} ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''})"
                           for kind, paths in missing.items())
        raise ConfigError(f"attribution.method=lrp: the composite {name} has no rule for {listed}; LRP would be wrong: "
                          f"use a model of Conv/Linear/BatchNorm/ReLU/pooling or another method (integrated_gradients)")
