"""One batch's attributions by captum (zennit for lrp), with the target used, the model's logit and
probability for it, captum's convergence delta (integrated gradients) and the deletion / insertion curves.

    engine = Engine(model, block, first_call, dataset)   # every check on the first batch (and every label
                                                         # that reads without its item: labels.py); the budget measured
    rows = engine.batch(call)     # {"attribution": (n, ...), "target": (n,), "logit", "prob", ["delta"], ...}

| method               | at: input                 | at: MODULE                      |
|----------------------|---------------------------|---------------------------------|
| saliency             | captum Saliency (abs)     | -                               |
| input_x_gradient     | captum InputXGradient     | captum LayerGradientXActivation |
| integrated_gradients | captum IntegratedGradients| captum LayerIntegratedGradients |
| occlusion            | captum Occlusion          | -                               |
| grad_cam             | -                         | captum LayerGradCam             |
| lrp                  | zennit Gradient + composite (on a copy of the model: canonizers change it) | - |

The memory budget (`memory`) is spent on the first batch's measured bytes per row (Budget, below):
integrated gradients' `internal_batch_size`, occlusion's `perturbations_per_eval` and the curves'
masked images per forward.

The memory budget (Budget, below) is spent on the first batch's measured bytes, never guessed: one
row's bytes are measured as every budgeted kind's forwards are (runner/memory.py): on CUDA the peak
allocated during the first batch's forward, elsewhere the bytes of every tensor a module returned in
it; a forward that keeps its graph for a backward counts twice (its gradients). Occlusion and the
deletion / insertion curves also build their perturbed inputs before the forward (captum's
`expanded * (1 - mask) + baseline * mask`: three input-sized tensors per row at once), so their row
is the measured forward plus three input rows: on CUDA, a 224 px ResNet-18 with 2 GB spent 2.33 GB on
occlusion without them (benchmarks/attribution.py, docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError, RunError, close_matches
from hookrun.hooks.plan import last_roles
from hookrun.hooks.plan_checks import ONCE_PER_FORWARD, refuse_alias
from hookrun.runner.kinds.attribution.baselines import Baselines, curves, measurable
from hookrun.runner.kinds.attribution.block import Block
from hookrun.runner.kinds.attribution.forward import LRP, Forward
from hookrun.runner.kinds.attribution.labels import check_labels
from hookrun.runner.memory import measure_bytes

W = "attribution"


class Engine:
    def __init__(self, model: nn.Module, block: Block, call: Any, dataset: Any = None, spec: Any = None,
                 planned: int | None = None) -> None:
        """`planned`: how many of the data set's items the run reads (data.limit); None: all of them."""
        self.model, self.block = model, block
        self.layer = self.module = find_module(model, block.layer) if block.layer else None
        if self.layer is not None and "output" in last_roles(self.layer, model):
            self.layer = nn.Identity()  # captum's layer: a channels-last map (Swin) seen channels first (view())
        self.lrp = LRP(model, block.composite, block.low, block.high) if block.method == "lrp" else None
        f = Forward(model, call)
        self.baselines = Baselines(block, f.input, dataset, spec)
        self.check_input(f)
        with torch.no_grad():
            logits, forward_bytes = measure_bytes(model, lambda: self.fires(f))
        self.classes = int(logits.shape[1])
        targets = self.targets(call, logits, first=True)
        check_labels(dataset, spec, block.target, len(dataset) if planned is None and dataset is not None else
                     planned or 0, self.classes)  # every batch's labels, where they read without the items
        self.baselines.of(call, f.input, first=True)
        self.budget = Budget(model, block, f, targets, forward_bytes)

    def view(self) -> Any:
        """While open, a channels-last module's (batch, H, W, C) output passes through `self.layer` as
        (batch, C, H, W) and back: captum's Layer* methods weigh and sum its channels (axis 1), and what
        they put in its place (integrated gradients' steps) goes on in the module's own layout; any
        other output passes through as it is."""
        if self.layer is self.module:
            return contextlib.nullcontext()
        tap = self.layer
        return self.module.register_forward_hook(
            lambda m, i, out: tap(out.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
            if isinstance(out, torch.Tensor) and out.dim() == 4 else tap(out))

    # -- checks on the first batch -------------------------------------------------------------
    def check_input(self, f: Forward) -> None:
        b, x = self.block, f.input
        if b.layer is None and not x.is_floating_point():
            raise ConfigError(f"{W}.at=input: the model's input is {str(x.dtype).replace('torch.', '')} (token ids?), "
                              f"which has no gradient; attribute to the embeddings' output instead, e.g. at: transformer.wte")
        if b.method == "occlusion":
            shape = tuple(x.shape[1:])
            if len(b.window) != len(shape) or any(w > s for w, s in zip(b.window, shape, strict=False)):
                raise ConfigError(f"{W}.window={list(b.window)}: larger than an item's input {list(shape)} (or another "
                                  f"number of axes); give one size per axis, each at most the input's")
        for key in ("low", "high"):  # epsilon_gamma_box's range: one number, or one per channel of the input
            v = getattr(b, key)
            if isinstance(v, list) and len(v) not in (1, x.shape[1] if x.dim() > 1 else 1):
                raise ConfigError(f"{W}.{key}={v}: {len(v)} values for an input of {x.shape[1]} channel(s); give one "
                                  f"number, or one per channel")
        if self.lrp is not None and f.model_extras:
            raise ConfigError(f"{W}.method=lrp: the model takes more than its input ({f.model_extras} more tensor(s)); "
                              f"zennit's Gradient calls model(input)")

    def fires(self, f: Forward) -> torch.Tensor:
        """The first batch's logits; `at: MODULE` must run in that forward."""
        if self.layer is None:  # (lrp: a module its rule keeps an input for must run once)
            return self.lrp.counted(self.model, lambda: f(f.input, *f.extras)) if self.lrp else f(f.input, *f.extras)
        seen = []
        handle = self.layer.register_forward_hook(lambda m, i, out: seen.append(out))
        try:
            with self.view():
                logits = f(f.input, *f.extras)
        finally:
            handle.remove()
        if not seen:
            raise ConfigError(f"{W}.at={self.block.at!r}: the module never ran in a forward of the first batch; "
                              f"attribute to a module the forward calls (python -m hookrun.modules lists them)")
        if len(seen) > 1:
            raise ConfigError(f"{W}.at={self.block.at!r}: the module runs {len(seen)} times in a forward, and a layer "
                              f"attribution is to one output; attribute to a module that runs once")
        if self.block.measure:
            self.check_measurable(seen[0], f.input)
        if self.block.method == "grad_cam":
            self.check_maps(seen[0], f.input)
        return logits

    def check_maps(self, out: Any, x: torch.Tensor) -> None:
        """grad_cam weighs the channels (axis 1) of feature maps (sample, channel, spatial...): captum's
        LayerGradCam gives a class vector (at: fc) one number, and a token model's (sample, position,
        feature) output a map over features with its positions summed away."""
        out = out[0] if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor) else out
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if shape is not None and len(shape) >= 3 and x.is_floating_point():
            return
        got = f"(sample, {', '.join(map(str, shape[1:]))})" if shape else f"a {type(out).__name__}"
        why = "a token model's output is (sample, position, feature), not channels and space" \
            if shape is not None and len(shape) >= 3 else "it has no spatial axes"
        convs = [n for n, m in self.model.named_modules() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d)]
        raise ConfigError(f"{W}.at={self.block.at!r}: grad_cam weighs the channels of feature maps (sample, channel, "
                          f"height, width), but the module gives {got}: {why}; name a convolutional module"
                          f"{f' (e.g. at: {convs[-1]})' if convs else ''}, or use integrated_gradients or input_x_gradient")

    def check_measurable(self, out: Any, x: torch.Tensor) -> None:
        """measure ranks the input's pixels (positions) by the attribution: at: MODULE's output must map
        onto them (an image's spatial axes; a sequence's positions), which a class vector (at: fc) does not."""
        out = out[0] if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor) else out
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if shape is not None and measurable(shape, x):
            return
        if x.dim() == 4:
            convs = [n for n, m in self.model.named_modules() if isinstance(m, nn.Conv2d)]
            want = f"a module whose output has height and width{f' (e.g. at: {convs[-1]})' if convs else ''}"
        else:
            want = f"a module whose output has the input's {x.shape[1] if x.dim() > 1 else 0} positions (sample, position, feature)"
        got = f"(sample, {', '.join(map(str, shape[1:]))})" if shape else f"a {type(out).__name__}"
        raise ConfigError(f"{W}.measure: deletion and insertion rank the input's pixels by the attribution, but "
                          f"at={self.block.at!r} gives {got}, which has no spatial axes to rank; attribute to "
                          f"{want}, or at: input, or leave measure out")

    def targets(self, call: Any, logits: torch.Tensor | None, first: bool = False, x: torch.Tensor | None = None) -> torch.Tensor:
        """The class attributed, per sample; `logits` are needed for target=predicted (and the first batch)."""
        err, t = ConfigError if first else RunError, self.block.target
        n, classes = (logits.shape[0], logits.shape[1]) if logits is not None else (x.shape[0], self.classes)
        device = logits.device if logits is not None else x.device
        if t == "predicted":
            return logits.argmax(1)
        if isinstance(t, int):
            value: Any = torch.full((n,), t)
        elif t == "label":
            value = call.target
            if value is None:
                raise err(f"{W}.target=label: the items have no label (data.target); use predicted, a class number "
                          f"or an item key")
        else:
            batch = call.batch
            if not isinstance(batch, dict) or t not in batch:
                keys = list(batch) if isinstance(batch, dict) else []
                hint = close_matches(str(t), [str(k) for k in keys], n=1)
                raise err(f"{W}.target={t!r}: the items have no key {t!r}{f'; did you mean {hint[0]}?' if hint else ''} "
                          f"(their keys: {', '.join(map(str, keys)) or 'none: they are not dicts'}); give label, "
                          f"predicted, a class number or an item key")
            value = batch[t]
        value = torch.as_tensor(value).to(device)
        if value.dim() > 1 and value.shape[1:].numel() == 1:  # (n, 1) labels
            value = value.reshape(-1)
        if tuple(value.shape) != (n,):
            raise err(f"{W}.target={t}: gives {tuple(value.shape)} for a batch of {n} items; give one class number "
                      f"per item")
        whole = value.round() == value if value.is_floating_point() else torch.ones_like(value, dtype=torch.bool)
        if value.is_complex() or not bool(whole.all()):
            bad = f"{value[~whole][0].item():g}" if not value.is_complex() else value[0].item()
            raise err(f"{W}.target={t}: {bad} is not a class number (a whole number, 0 or more); the attribution is "
                      f"of one class's logit")
        value = value.long()
        if value.min() < 0 or value.max() >= classes:
            bad = int(value.max()) if value.numel() and value.max() >= classes else int(value.min())
            raise err(f"{W}.target={t}: class {bad} is out of range: the model has {classes} classes "
                      f"(0 to {classes - 1})")
        return value

    # -- a batch -------------------------------------------------------------------------------
    def batch(self, call: Any) -> dict[str, torch.Tensor]:
        f = Forward(self.model, call)
        x = f.input.detach().clone()
        logits = None
        if self.block.target == "predicted" or self.lrp is not None:
            with torch.no_grad():
                logits = f(x, *f.extras)
        target = self.targets(call, logits, x=x)
        baseline = self.baselines.of(call, x)
        f.watch = x  # the method's own forward of x gives the logits (no forward of their own)
        with self.view():
            attr, delta = self.attribute(f, x, target, baseline)
        if logits is None:
            logits = f.seen
        if logits is None:  # (a method that never ran x itself)
            with torch.no_grad():
                logits = f(x, *f.extras)
        picked = logits.gather(1, target[:, None])[:, 0]
        out = {"attribution": attr.detach(), "target": target, "logit": picked,
               "prob": torch.softmax(logits.double(), 1).gather(1, target[:, None])[:, 0]}
        if delta is not None:
            out["delta"] = delta.detach().reshape(-1)
        if self.block.measure:
            out.update(curves(f, x, baseline, target, attr.detach(), self.block.measure, self.budget.rows_per_forward))
        return {k: v.float() if v.dtype == torch.bfloat16 else v for k, v in out.items()}  # (numpy and HDF5 have no bfloat16)

    def attribute(self, f: Forward, x: torch.Tensor, target: torch.Tensor, baseline: torch.Tensor) -> tuple[torch.Tensor, Any]:
        from captum import attr as ca

        b, layer = self.block, self.layer
        kw = {"target": target, "additional_forward_args": f.extras or None}
        if b.method == "saliency":
            return ca.Saliency(f).attribute(x, abs=True, **kw), None
        if b.method == "input_x_gradient":
            if layer is not None:
                return ca.LayerGradientXActivation(f, layer).attribute(x, **kw), None
            return ca.InputXGradient(f).attribute(x, **kw), None
        if b.method == "integrated_gradients":
            ig = ca.LayerIntegratedGradients(f, layer) if layer is not None else ca.IntegratedGradients(f)
            return ig.attribute(x, baselines=baseline, n_steps=b.steps, method=b.rule, return_convergence_delta=True,
                                internal_batch_size=self.budget.internal_batch_size(x.shape[0]), **kw)
        if b.method == "occlusion":
            return ca.Occlusion(f).attribute(x, sliding_window_shapes=b.window, strides=b.strides, baselines=baseline,
                                             perturbations_per_eval=self.budget.perturbations_per_eval, **kw), None
        if b.method == "grad_cam":
            return ca.LayerGradCam(f, layer).attribute(x, relu_attributions=b.relu, **kw), None
        return self.lrp.attribute(x, target, self.classes), None


def find_module(model: nn.Module, name: str) -> nn.Module:
    modules = dict(model.named_modules())
    if name not in modules:
        refuse_alias(model, name, f"{W}.at", then=ONCE_PER_FORWARD.format(w=f"{W}.at"))  # (a second name)
        hint = close_matches(name, [n for n in modules if n], n=3)
        raise ConfigError(f"{W}.at={name!r}: the model has no module {name!r}"
                          f"{'; closest names: ' + ', '.join(hint) if hint else ''} (or at: input)")
    return modules[name]


def dims_of(attr_shape: tuple[int, ...]) -> tuple[str, ...]:
    """The attribution's axis names: images `sample, channel, height, width`; token inputs (and any
    sequence) `sample, position, feature`."""
    named = {4: ("sample", "channel", "height", "width"), 3: ("sample", "position", "feature"), 2: ("sample", "feature")}
    return named.get(len(attr_shape), ("sample", *[f"dim_{i}" for i in range(1, len(attr_shape))]))


class Budget:
    def __init__(self, model: nn.Module, block: Block, f: Any, targets: torch.Tensor, forward: int) -> None:
        """`forward`: the bytes the first batch's forward (no graph) took, measured by the engine."""
        self.block = block
        x = f.input.detach()
        n = max(1, x.shape[0])
        self.forward_row = max(1, forward // n)  # one row's forward, no graph
        self.grad_row = self.forward_row
        perturbed_row = self.forward_row + 3 * x[0].numel() * x.element_size()
        if block.method == "integrated_gradients":
            with torch.enable_grad():
                xg = x.clone().requires_grad_(x.is_floating_point())
                _, kept = measure_bytes(model, lambda: f(xg, *f.extras).gather(1, targets[:, None]).sum())
            self.grad_row = max(1, 2 * kept // n)
        self.rows_per_forward = max(1, block.memory // perturbed_row)
        self.perturbations_per_eval = max(1, block.memory // (perturbed_row * n))
        self.perturbed_row = perturbed_row

    def internal_batch_size(self, n: int) -> int:
        """Integrated gradients' rows per forward: at least the batch (captum's floor), at most every step's."""
        return int(min(n * self.block.steps, max(n, self.block.memory // self.grad_row)))

    def describe(self) -> dict[str, int]:
        """What the file's `attribution` attribute says of the budget."""
        ig = self.block.method == "integrated_gradients"
        out = {"bytes_per_row": int(self.grad_row if ig else self.perturbed_row)}
        if ig:
            out["rows_per_forward"] = int(max(1, self.block.memory // self.grad_row))
        if self.block.method == "occlusion":
            out["perturbations_per_eval"] = int(self.perturbations_per_eval)
        if self.block.measure:
            out["curve_rows_per_forward"] = int(self.rows_per_forward)
        return out
