"""The `attribution:` block, checked: what an attribution run (or hookrun.attribute) was asked for.

    block = parse_block({"method": "occlusion", "window": [3, 8, 8]})
    block.strides   # (3, 8, 8): the window's own size where strides are not given

Every key is checked here, before the model is built: a wrong value is one ConfigError naming the
key, what is wrong and the choices. What needs the model or the first batch (a module that never
runs, a target class out of range, a window larger than the input, a baseline of the wrong shape)
is checked by the engine (engine.py) on the first batch, still before any batch is written (a later
batch's labels too, where they read without loading the items: labels.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hookrun.errors import ConfigError, close_matches, one_of, parse_bytes

METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "occlusion", "grad_cam", "lrp")
LAYER_METHODS = ("integrated_gradients", "input_x_gradient", "grad_cam")  # at: MODULE (captum's Layer* classes)
INPUT_METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "occlusion", "lrp")
RULES = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid")
BASELINES = ("zero", "mean", "blur")
MEASURES = ("deletion", "insertion")
BOX = "epsilon_gamma_box"  # the composite whose first convolution's rule (zennit's ZBox) needs the input's low and high
WHERE = "attribution"


@dataclass
class Block:
    """The `attribution:` block: its keys and defaults (YAML types them), normalised by `check()`."""

    method: str = "integrated_gradients"  # saliency | input_x_gradient | integrated_gradients | occlusion | grad_cam | lrp
    at: str = "input"  # input, or a module path: attribution to that module's output (layer attribution)
    target: Any = "label"  # label | predicted | a class number | an item key
    baseline: str = "zero"  # zero | mean (the data set's mean input) | blur (gaussian, sigma pixels) | an item key
    sigma: float = 5.0  # baseline=blur: the gaussian's sigma in pixels
    steps: int = 32  # integrated_gradients: interpolation steps
    rule: str = "gausslegendre"  # integrated_gradients: gausslegendre | riemann_left | riemann_right | riemann_middle | riemann_trapezoid
    window: list[int] | None = None  # occlusion: the sliding window's shape (without the sample axis)
    strides: list[int] | None = None  # occlusion: its strides; null: the window's shape
    composite: str = "epsilon_plus_flat"  # lrp: a zennit composite (epsilon_gamma_box: with low and high)
    relu: bool = False  # grad_cam: captum's relu_attributions
    memory: Any = "1GiB"  # the budget for one forward (+ backward): steps / occluded copies per forward
    measure: dict[str, int] | None = None  # {deletion: N, insertion: N}: curves of the target's probability
    low: Any = None  # composite=epsilon_gamma_box: the lowest input value its box rule takes (a number, or one per channel)
    high: Any = None  # ... and the highest

    @property
    def layer(self) -> str | None:
        """The module attributed to, or None for the input."""
        return None if self.at == "input" else self.at

    def describe(self) -> dict[str, Any]:
        """The block as the file's `attribution` attribute holds it (JSON-ready)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    def check(self) -> None:
        """Every key checked and normalised in place (memory in bytes, window a tuple, ...), once."""
        for f in fields(self):
            setattr(self, f.name, getattr(_checked(self), f.name))


def parse_block(node: Any) -> Block:
    """The `attribution:` block (a mapping, as hookrun.attribute's keywords give it) -> Block, checked."""
    from hookrun.config.plugins import parse_block as parse

    if node is None:
        raise ConfigError("attribution: the block is null; give at least {method: saliency}")
    return parse("attribution", node)


def _checked(d: Block) -> Block:
    method = _choice(d.method, METHODS, "method")
    at = str(d.at if d.at is not None else "input")
    if at != "input" and method not in LAYER_METHODS:
        raise ConfigError(f"{WHERE}.at={at!r}: method={method} attributes to the input only; at: a module works with "
                          f"{', '.join(LAYER_METHODS)} (or set at: input)")
    if at == "input" and method == "grad_cam":
        raise ConfigError(f"{WHERE}.at=input: grad_cam weighs a layer's feature maps; name a convolutional module "
                          f"(python -m hookrun.modules lists them)")
    if not at.strip():
        raise ConfigError(f"{WHERE}.at={at!r}: the model itself, whose output is the logits attributed; give input "
                          f"or a module inside it (python -m hookrun.modules lists them)")
    target = d.target
    if isinstance(target, bool) or target is None or (isinstance(target, int) and target < 0) or \
            not isinstance(target, int | str):
        raise ConfigError(f"{WHERE}.target={target!r}; give label, predicted, a class number (0 or more) or an item key")
    if isinstance(target, str) and target.strip().lstrip("-").isdigit():
        target = int(target)
    baseline = d.baseline
    if not isinstance(baseline, str) or not baseline:
        raise ConfigError(f"{WHERE}.baseline={baseline!r}; give {', '.join(BASELINES)} or an item key")
    sigma = _number(d.sigma, "sigma", float)
    steps = _number(d.steps, "steps", int)
    rule = _choice(d.rule, RULES, "rule")
    window, strides = _shape(d.window, "window"), _shape(d.strides, "strides")
    if method == "occlusion":
        if window is None:
            raise ConfigError(f"{WHERE}.window: occlusion needs the sliding window's shape, one size per axis of an "
                              f"item's input without the sample axis (e.g. [3, 16, 16] for 3-channel images)")
        strides = window if strides is None else strides
        if len(strides) != len(window):
            raise ConfigError(f"{WHERE}.strides={list(strides)}: give one stride per axis of window={list(window)}")
    composite = str(d.composite)
    if method == "lrp":
        from zennit.composites import COMPOSITES

        if composite not in COMPOSITES:
            hint = close_matches(composite, COMPOSITES, n=1)
            raise ConfigError(f"{WHERE}.composite={composite!r}: not one of zennit's composites"
                              f"{f'; did you mean {hint[0]}?' if hint else ''} (choose from {one_of(COMPOSITES)})")
    low, high = _bound(d.low, "low"), _bound(d.high, "high")
    box = method == "lrp" and composite == BOX
    if box and (low is None or high is None):
        raise ConfigError(f"{WHERE}.composite={BOX}: its box rule (the first convolution's) needs the range of that "
                          f"layer's input; give low and high (e.g. low: 0, high: 1 for images in [0, 1]; one value per "
                          f"channel for normalized images: (0 - mean) / std and (1 - mean) / std)")
    if not box and (low is not None or high is not None):
        raise ConfigError(f"{WHERE}.{'low' if low is not None else 'high'}: the box rule's range, used only by "
                          f"method=lrp with composite={BOX}; remove it or use that composite")
    if box and isinstance(low, list) and isinstance(high, list) and len(low) != len(high):
        raise ConfigError(f"{WHERE}.low={low}, high={high}: give one value per channel in both, or one number each")
    n = max(len(v) if isinstance(v, list) else 1 for v in (low, high))  # (a number: the same for every channel)
    lows, highs = (v if isinstance(v, list) else [v] * n for v in (low, high))
    if box and any(lo >= hi for lo, hi in zip(lows, highs, strict=True)):
        raise ConfigError(f"{WHERE}.low={low}, high={high}: each low must be below its high (the lowest and highest "
                          f"value the first convolution's input can take)")
    relu = d.relu
    if not isinstance(relu, bool):
        raise ConfigError(f"{WHERE}.relu={relu!r}; give true or false (grad_cam: captum's relu_attributions)")
    memory = parse_bytes(d.memory, f"{WHERE}.memory")  # (a positive int is bytes already; 0 or less is refused)
    return Block(method, at, target, baseline, sigma, steps, rule, window, strides, composite, relu, memory,
                 _measure(d.measure), low, high)


def _bound(value: Any, key: str) -> float | list[float] | None:
    if value is None:
        return None
    items = list(value) if hasattr(value, "__iter__") and not isinstance(value, str | Mapping) else None  # (a ListConfig)
    number = lambda v: not isinstance(v, bool) and isinstance(v, int | float)  # noqa: E731
    if items is not None and items and all(number(v) for v in items):
        return [float(v) for v in items]
    if number(value):
        return float(value)
    raise ConfigError(f"{WHERE}.{key}={value!r}; give a number (the input's {'lowest' if key == 'low' else 'highest'} "
                      f"value) or a list of them, one per channel")


def _choice(value: Any, choices: tuple[str, ...], key: str) -> str:
    if value not in choices:
        hint = close_matches(str(value), choices, n=1)
        raise ConfigError(f"{WHERE}.{key}={value!r}: not a choice{f'; did you mean {hint[0]}?' if hint else ''} "
                          f"(choose from {', '.join(choices)})")
    return str(value)


def _number(value: Any, key: str, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or (kind is int and value != int(value)):
        raise ConfigError(f"{WHERE}.{key}={value!r}; give a positive {'integer' if kind is int else 'number'}")
    return kind(value)


def _shape(value: Any, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    items = list(value) if isinstance(value, list | tuple) or hasattr(value, "__iter__") and not isinstance(value, str) else None
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in items):
        raise ConfigError(f"{WHERE}.{key}={value!r}; give a list of positive integers, one per axis of an item's "
                          f"input (e.g. [3, 16, 16])")
    return tuple(int(v) for v in items)


def _measure(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{WHERE}.measure={value!r}; give a mapping such as {{deletion: 16, insertion: 16}}")
    out = {}
    for k, n in value.items():
        if k not in MEASURES:
            raise ConfigError(f"{WHERE}.measure.{k}: not a measure; choose from {', '.join(MEASURES)}")
        if n is None:
            continue
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{WHERE}.measure.{k}={n!r}; give the curve's number of steps, a positive integer")
        out[str(k)] = int(n)
    return out
