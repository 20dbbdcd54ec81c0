"""The module lister: every name `at:` accepts, with its type, parameters, shapes and calls.

    table = list_modules(model, torch.randn(1, 3, 224, 224), match="layer1.**")
    print(table)  # name, type, params, calls, input and output shapes for that example
    list_modules(model, x, ops=True)  # and under each module its op sites: layer1.0/add_.0 ...

The counterpart of torchvision's get_graph_node_names for hooks: the names are those of
`named_modules()` (`''` is the whole model); one forward of the example, under no_grad and in eval
mode (each module's training flag comes back after; BatchNorm's running statistics stay as they
were), shows what each module receives (keyword inputs too) and returns, and how many times it
runs per forward.
With `ops=True` each module's op sites (hooks/sites.py) follow it in call order, named as `at:`
takes them (`transformer.h.0.attn/softmax.0`), found by the same interception the hooks use.
Every hook it sets is removed before it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError, NotFoundError
from hookrun.hooks import flatten
from hookrun.hooks.actions import ModelHold
from hookrun.hooks.plan import resolve_targets, split_site, unwrap
from hookrun.hooks.site_check import unfuse
from hookrun.hooks.sites import Listener, fn_label


@dataclass
class ModuleInfo:
    name: str  # as `at:` takes it; '' is the whole model
    type: str  # the module's class name
    params: int  # parameters, submodules' included
    calls: int | None = None  # runs per forward of the example; None: no example given
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # role -> shape, first call
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    op: str | None = None  # an op site: the torch function it calls (torch.matmul, Tensor.add, F.softmax)


class ModuleTable(list):
    """A list of ModuleInfo that prints as an aligned table."""

    def names(self) -> list[str]:
        return [m.name for m in self]

    def ops(self) -> ModuleTable:
        """The op sites only (rows of `ops=True`)."""
        return ModuleTable(m for m in self if m.op is not None)

    def __str__(self) -> str:
        shown = self[0].calls is not None if self else False
        head = ["module", "type", "params"] + (["calls", "input", "output"] if shown else [])
        rows = [head]
        for m in self:
            row = [m.name or "''  (the model)", m.type, f"{m.params:,}" if m.op is None else "-"]
            if shown:
                row += [str(m.calls), _shapes(m.inputs) if m.calls else "-", _shapes(m.outputs) if m.calls else "-"]
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def list_modules(model: nn.Module, example: Any = None, match: str | None = None, ops: bool = False) -> ModuleTable:
    """Every module of `model` (or those `match`, a name or glob, selects), with the shapes it
    sees when `model(example)` runs once: a tensor, a tuple of positional inputs, or a dict of
    keyword inputs (`model(**example)`); with `ops=True` each module's op sites too.

        list_modules(model, x, match="**.relu").names()  # what hooks.NAME.at: '**.relu' hooks
        list_modules(gpt2, batch, match="transformer.h.*.attn/softmax").names()  # [...attn/softmax.0, ...]

    Args:
        model: any nn.Module (DDP / DataParallel / torch.compile wrappers are looked through).
        example: one input for one forward under no_grad, in eval mode (None: names, types and parameters only).
        match: a module name or glob, as `at:` takes it; or an op site (`MODULE/FN[.k]`, a glob in
            MODULE allowed), which lists just those sites (and implies ops=True).
        ops: list under each module the op sites its own forward calls, in call order, with the
            shapes of their tensor arguments and results (needs `example`).

    Returns:
        ModuleTable: a list of ModuleInfo (name, type, params, calls, inputs, outputs; `op` for an
        op site) that prints as an aligned table.

    Raises:
        ConfigError: `model` is not an nn.Module, `match` names nothing (with the closest names),
            or ops without an example.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"modules: expected a torch.nn.Module, got {type(model).__name__}")
    named = dict(unwrap(model).named_modules())  # the names `at:` takes (inside DDP / torch.compile wrappers)
    site = split_site(match, set(named)) if match is not None else None
    ops = ops or site is not None
    if ops and example is None:
        raise ConfigError("modules: op sites are found by running the model once; give an example input "
                          "(hookrun.modules(model, example, ops=True))")
    chosen = _select(model, list(named), site[0] if site is not None else match)
    table = ModuleTable(ModuleInfo(n, type(named[n]).__name__, sum(p.numel() for p in named[n].parameters()))
                        for n in chosen)
    if example is None:
        return table
    infos = {m.name: m for m in table}
    for m in table:
        m.calls = 0
    handles, listener, found = [], None, {n: {} for n in chosen}
    restore = unfuse([named[n] for n in chosen], "modules") if ops else None  # the op sites a run would hook
    try:
        for name, info in infos.items():
            handles.append(named[name].register_forward_pre_hook(_seen_input(info), with_kwargs=True))
            handles.append(named[name].register_forward_hook(_seen_output(info)))
        if ops:
            listener = Listener(_seen_op({m: n for n, m in named.items() if n in found}, found), named[""])
            for name in chosen:
                handles.extend(listener.watch(named[name]))
        with torch.no_grad(), ModelHold(model):  # in eval mode, as a run: BatchNorm's statistics and
            model.eval()                         # dropout untouched; each module's training flag comes back
            _call(model, example)
    finally:
        for h in reversed(handles):
            h.remove()
        if restore is not None:
            restore()
    if not ops:
        return table
    out = ModuleTable()
    for m in table:
        if site is None:
            out.append(m)
        out.extend(op for (fn, k), op in found[m.name].items()
                   if site is None or (fn == site[1] and site[2] in (None, k)))
    if site is not None and not out:
        raise ConfigError(f"--match: {match!r} names no op site that runs in one forward of the example; "
                          f"list them all with --ops (ops=True){_calls_of(found, site)}")
    return out


def _seen_op(names: dict[nn.Module, str], found: dict[str, dict]):
    """The listener's callback: one ModuleInfo per site (MODULE/FN.k), its calls counted."""

    def on_call(module: nn.Module, fn: str, k: int, func: Any, args: tuple, result: Any) -> None:
        name = names[module]
        info = found[name].get((fn, k))
        if info is None:
            found[name][fn, k] = ModuleInfo(f"{name}/{fn}.{k}", fn_label(func), 0, calls=1, inputs=_shapes_of(args, "input"),
                                             outputs=_shapes_of(result, "output"), op=fn_label(func))
        else:
            info.calls += 1

    return on_call


def _calls_of(found: dict[str, dict], site: tuple) -> str:
    """Which FNs the selected modules' own forwards do call (for the error)."""
    fns = sorted({fn for ops in found.values() for fn, _ in ops})
    return f"; their own forwards call: {', '.join(fns[:20])}{', ...' if len(fns) > 20 else ''}" if fns else ""


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
    from hookrun.runner.calls import model_forward  # (its exception in one line, as a run's)

    args, kwargs = ((), dict(example)) if isinstance(example, Mapping) else \
        (tuple(example), {}) if isinstance(example, tuple | list) else ((example,), {})
    try:
        return model_forward(model, args, kwargs, error=ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"modules: {exc}; give an example the model takes (model(x) for a tensor, model(*x) for a "
                          f"tuple, model(**x) for a dict), or none for the names, types and parameters alone") from exc.__cause__
