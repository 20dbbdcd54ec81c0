"""The module lister: every name `at:` accepts, with its type, parameters, shapes and calls.

    table = list_modules(model, torch.randn(1, 3, 224, 224), match="layer1.**")
    print(table)  # name, type, params, calls, input and output shapes for that example

The counterpart of torchvision's get_graph_node_names for hooks: the names are those of
`named_modules()` (`''` is the whole model); one forward of the example, under no_grad, shows what
each module receives (keyword inputs too) and returns, and how many times it runs per forward.
Every hook it sets is removed before it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError, NotFoundError
from hookrun.hooks.events import flatten
from hookrun.hooks.plan import resolve_targets, unwrap


@dataclass
class ModuleInfo:
    name: str  # as `at:` takes it; '' is the whole model
    type: str  # the module's class name
    params: int  # parameters, submodules' included
    calls: int | None = None  # runs per forward of the example; None: no example given
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # role -> shape, first call
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)


class ModuleTable(list):
    """A list of ModuleInfo that prints as an aligned table."""

    def names(self) -> list[str]:
        return [m.name for m in self]

    def __str__(self) -> str:
        shown = self[0].calls is not None if self else False
        head = ["module", "type", "params"] + (["calls", "input", "output"] if shown else [])
        rows = [head]
        for m in self:
            row = [m.name or "''  (the model)", m.type, f"{m.params:,}"]
            if shown:
                row += [str(m.calls), _shapes(m.inputs) if m.calls else "-", _shapes(m.outputs) if m.calls else "-"]
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def list_modules(model: nn.Module, example: Any = None, match: str | None = None) -> ModuleTable:
    """Every module of `model` (or those `match`, a name or glob, selects), with the shapes it
    sees when `model(example)` runs once: a tensor, a tuple of positional inputs, or a dict of
    keyword inputs (`model(**example)`).

        list_modules(model, x, match="**.relu").names()  # what hooks.NAME.at: '**.relu' hooks

    Args:
        model: any nn.Module (DDP / DataParallel / torch.compile wrappers are looked through).
        example: one input for one forward under no_grad (None: names, types and parameters only).
        match: a module name or glob, as `at:` takes it.

    Returns:
        ModuleTable: a list of ModuleInfo (name, type, params, calls, inputs, outputs) that prints
        as an aligned table.

    Raises:
        ConfigError: `model` is not an nn.Module, or `match` names nothing (with the closest names).
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"modules: expected a torch.nn.Module, got {type(model).__name__}")
    named = dict(unwrap(model).named_modules())  # the names `at:` takes (inside DDP / torch.compile wrappers)
    chosen = _select(model, list(named), match)
    table = ModuleTable(ModuleInfo(n, type(named[n]).__name__, sum(p.numel() for p in named[n].parameters()))
                        for n in chosen)
    if example is None:
        return table
    infos = {m.name: m for m in table}
    for m in table:
        m.calls = 0
    handles = []
    try:
        for name, info in infos.items():
            handles.append(named[name].register_forward_pre_hook(_seen_input(info), with_kwargs=True))
            handles.append(named[name].register_forward_hook(_seen_output(info)))
        with torch.no_grad():
            _call(model, example)
    finally:
        for h in reversed(handles):
            h.remove()
    return table


def _select(model: nn.Module, names: list[str], match: str | None) -> list[str]:
    """The names `match` selects, by the plan's own matching (what `hooks.NAME.at: MATCH` would hook)."""
    if match is None:
        return names
    try:
        return [name for name, _ in resolve_targets(model, [match], hook="", where="--match")]
    except NotFoundError as exc:  # an exact name that is not there: the lister's error is a ConfigError
        raise ConfigError(str(exc)) from None


def _seen_input(info: ModuleInfo):
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        info.calls += 1
        if info.calls == 1:
            info.inputs = {**_shapes_of(args, "input"), **{k: tuple(v.shape) for k, v in flatten(kwargs, "").items()}}
            info.inputs = {k.lstrip("."): v for k, v in info.inputs.items()}

    return hook


def _seen_output(info: ModuleInfo):
    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        if not info.outputs:
            info.outputs = _shapes_of(output, "output")

    return hook


def _shapes_of(obj: Any, prefix: str) -> dict[str, tuple[int, ...]]:
    return {role: tuple(t.shape) for role, t in flatten(obj, prefix).items()}


def _shapes(shapes: dict[str, tuple[int, ...]]) -> str:
    text = [f"{role}={list(s)}" if role not in ("input", "output") else str(list(s)) for role, s in shapes.items()]
    return "; ".join(text) or "(no tensor)"


def _call(model: nn.Module, example: Any) -> Any:
    if callable(getattr(example, "run", None)):  # a batch already split into the forward call (runner's ModelCall)
        return example.run(model)
    if isinstance(example, Mapping):
        return model(**example)
    if isinstance(example, tuple | list):
        return model(*example)
    return model(example)
