"""Building objects from `_target_` nodes: the model, the dataset, the loss, user actions and ops; and a
model's weights named in a few bytes (`weights_digest`: the file's `model_fingerprint`).

    model = build_model({"_target_": "torchvision.models.resnet18", "weights": None})
    weights_digest(model)   # 32 hex digits: one value changed anywhere changes them

This is the one module that calls hydra.utils.instantiate; every failure becomes a ConfigError
naming the config key and the target.

Typed parameters of actions and ops: the one place their booleans are checked.

    from hookrun.hooks.splice import splice          # the op's factory: error_term: bool = False
    typed_params(splice, {"error_term": "false", "path": "saes/h1"}, "hooks.sae.actions.0")
    # {'error_term': False, 'path': 'saes/h1'}

An action's or op's parameters are sibling keys of the action in the config (`{name: modify_output,
op: splice, error_term: false}`); YAML, a script or an override may give a boolean as a string.
Every parameter the callable declares as `bool` (annotated `bool` or `bool | None`, or defaulting
to True/False) is read as the schema's own booleans are: True/False, 0/1, or the strings true/false,
yes/no, on/off (any case); anything else is one ConfigError naming the key. Every parameter annotated
with numbers alone (`float`, `int | None`, `float | list`, `int | list[int]`) takes a number (an
integer where only `int` is named; a numeric string is read as one) or one ConfigError naming the key,
before any batch (config/param_values.py, imported where a callable takes such a key). Other keys pass as given.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError, HookrunError


def build(node: Any, where: str, **kwargs: Any) -> Any:
    """instantiate(node), with a one-line ConfigError instead of Hydra's chained traceback."""
    if not isinstance(node, Mapping) or not node.get("_target_"):
        raise ConfigError(f"{where}: expected a node with `_target_: package.module.Name`, got {node!r}")
    # Hydra imported here, not with the module: a run of live objects (run(cfg, model=...)) never loads it
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(dict(node), _convert_="all", **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while isinstance(cause, InstantiationException):
            cause = cause.__cause__
        if isinstance(cause, HookrunError):  # a builder's own one-line message names its key (model.path: ...)
            raise ConfigError(str(cause)) from None
        from hookrun.config.targets import instantiation_message

        raise ConfigError(f"{where}: {instantiation_message(exc, node['_target_'])}") from None


BARS: ContextVar[bool] = ContextVar("hookrun_loading_bars", default=True)  # progress=false: no loading bar


@contextmanager
def loading_bars(on: bool) -> Iterator[None]:
    """Within it, models built by hookrun.models.hf() show transformers' weight-loading bar only when
    `on` (the run's `progress`); build_model enters it."""
    token = BARS.set(bool(on))
    try:
        yield
    finally:
        BARS.reset(token)


def build_model(node: Mapping, device: torch.device, progress: bool = True, where: str = "model") -> nn.Module:
    """The model a `model:` node builds, on `device`, in eval mode; `progress=False` keeps a
    library's weight-loading bar (transformers') off, as the run's own bar is. `where`: the node's key
    in the config, as errors name it (a kind's second model: similarity.with.model)."""
    node = dict(node)
    checkpoint = node.pop("checkpoint", None)
    try:
        with loading_bars(progress):
            model = build(node, where)
    except ConfigError as exc:
        if node.get("weights") and ("URLError" in str(exc) or "HTTPError" in str(exc)):
            from hookrun.config.checkpoint import weights_message

            raise ConfigError(weights_message(node, str(exc), where)) from None
        if node.get("weights_backbone") and ("URLError" in str(exc) or "HTTPError" in str(exc)):
            raise ConfigError(f"{where}.weights_backbone={node['weights_backbone']}: the backbone's pretrained weights are "
                              f"not in the torch hub cache ({Path(torch.hub.get_dir()) / 'checkpoints'}) and cannot be "
                              f"downloaded; set {where}.weights_backbone=null for a random-init backbone") from None
        raise
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{where}: {node['_target_']!r} built a {type(model).__name__}, not a torch.nn.Module")
    if checkpoint:
        from hookrun.config.checkpoint import load_checkpoint

        load_checkpoint(model, str(checkpoint), where)
    return model.to(device).eval()


def live_model(model: Any, device: torch.device) -> nn.Module:
    """A model object given to run(cfg, model=...): checked, moved to the device, in eval mode."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"run(model=...): got a {type(model).__name__}, not a torch.nn.Module")
    return model.to(device).eval()


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of the model's parameters and buffers, 32 hex digits: the first 16 by name, dtype, shape
    and each tensor's first and last four values (what files written before 2026-12 hold, 16 digits:
    same_weights compares those with them), the last 16 by every value's bytes as well (xxh3, about
    1.5 GB/s on one core here; a GPU tensor is copied to the host 64 MiB at a time), so one value
    changed anywhere, a neuron zeroed in the middle of a matrix, changes it. '' where a tensor cannot
    be read (meta, sharded)."""
    ends, full = hashlib.sha256(), hashlib.sha256()
    try:
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            flat = t.detach().reshape(-1)
            head = f"{name} {t.dtype} {tuple(t.shape)}"
            ends.update(head.encode())
            ends.update((torch.cat([flat[:4], flat[-4:]]) if flat.numel() > 8 else flat).to("cpu", torch.float64).numpy().tobytes())
            full.update(f"{head} {_bytes_digest(flat)}".encode())
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return ""
    return ends.hexdigest()[:16] + full.hexdigest()[:16]


def same_weights(theirs: str, mine: str) -> bool:
    """Whether a file's model_fingerprint names the weights whose weights_digest is `mine`: an older
    file's 16 digits are compared with the part computed as it was then."""
    return theirs == (mine[:16] if len(theirs) == 16 else mine)


_INTS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_BLOCK = 64 << 20


def _bytes_digest(t: torch.Tensor) -> str:
    """xxh3-64 of the tensor's values' bytes, in order (a non-contiguous tensor is read as reshape sees it)."""
    import xxhash

    flat = t.reshape(-1)
    flat = flat.view(_INTS[flat.element_size()]) if flat.element_size() in _INTS and flat.dtype != torch.bool \
        else flat.to(torch.uint8) if flat.dtype == torch.bool else flat.contiguous().view(torch.uint8)
    h, step = xxhash.xxh3_64(), max(1, _BLOCK // flat.element_size())
    for start in range(0, flat.numel(), step):
        block = flat[start : start + step].cpu().contiguous().numpy()
        h.update(memoryview(block).cast("B"))
    return h.hexdigest()


def build_dataset(node: Mapping, where: str = "data.dataset") -> Any:
    """The map-style dataset a node builds (`where`: the key its one-line errors name; a data set's own
    errors name data.dataset, the node's key under `data:`, and are re-keyed to `where`, e.g.
    probe.test_data.dataset.size)."""
    try:
        dataset = build(node, where)
    except ConfigError as exc:
        own = re.match(r"data\.dataset(?=[.:=\s])", str(exc))
        if own is None or where == "data.dataset":
            raise
        raise ConfigError(where + str(exc)[own.end():]) from None
    return check_dataset(dataset, f"{where}: {node['_target_']!r} built")


def check_dataset(dataset: Any, where: str) -> Any:
    """A map-style dataset, or a one-line ConfigError: a torch IterableDataset (with a __len__ or not) has
    only torch's Dataset.__getitem__, which raises NotImplementedError; refused by name before any item."""
    need = ("hookrun needs a map-style dataset (with __len__ and __getitem__): give the items as a list "
            "(list(itertools.islice(data, N))) or a Dataset that reads item i")
    if isinstance(dataset, torch.utils.data.DataLoader):  # (its batches as items: wrong rows, no error at an MLP)
        raise ConfigError(f"{where} a DataLoader, whose items are batches; give the data set it reads, loader.dataset "
                          f"(hookrun batches its items itself; a collate_fn is data.collate in a config)")
    if getattr(type(dataset), "__getitem__", None) is torch.utils.data.Dataset.__getitem__:
        kind = "IterableDataset" if isinstance(dataset, torch.utils.data.IterableDataset) else "Dataset"
        raise ConfigError(f"{where} a {type(dataset).__name__}, a torch {kind} without its own __getitem__ "
                          f"(torch's raises NotImplementedError: items streamed, not read by index); {need}")
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise ConfigError(f"{where} a {type(dataset).__name__}; {need}")
    if isinstance(dataset, Mapping) and dataset and 0 not in dataset:  # a tokenizer's batch: columns, not items
        rows = sorted({len(v) for v in dataset.values() if hasattr(v, "__len__")})
        raise ConfigError(f"{where} a {type(dataset).__name__} of columns ({', '.join(map(str, list(dataset)[:6]))}"
                          f"{': ' + ' or '.join(map(str, rows)) + ' rows each' if rows else ''}), which has no item 0; "
                          f"give one item per row: [{{k: v[i] for k, v in d.items()}} for i in range(n)]")
    return dataset


def build_loss(node: Mapping | None) -> Callable | None:
    if node is None:
        return None
    loss = build(node, "loss")
    if not callable(loss):
        raise ConfigError(f"loss: {node['_target_']!r} built a {type(loss).__name__}, which is not callable")
    return loss


def build_user_action(action_spec: Any, point: object, hook_type: object, env: object) -> Callable:
    """A `_target_` action: anything callable with the Event (a function needs `_partial_: true`).
    `point`, `hook_type` and `env` (the plan's HookPoint, HookType and ActionEnv) are opaque here:
    config/ sits above hooks/ and knows none of them."""
    action = build(action_spec.params, action_spec.where)
    if not callable(action):
        raise ConfigError(
            f"{action_spec.where}: {action_spec.params['_target_']!r} built a {type(action).__name__}, "
            f"which is not callable; an action is called with the Event (add `_partial_: true` for a function)"
        )
    return action


BOOL_ANNOTATIONS = {"bool", "bool|None", "None|bool", "Optional[bool]"}


def bool_keys(fn: Callable) -> set[str]:
    """The parameters of `fn` that take a boolean."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return set()
    out = set()
    for name, p in params.items():
        ann = p.annotation
        text = ann.replace(" ", "") if isinstance(ann, str) else "bool" if ann is bool else None
        if text in BOOL_ANNOTATIONS or (ann is p.empty and isinstance(p.default, bool)):
            out.add(name)
    return out


def typed_params(fn: Callable, params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`params` with every key `fn` takes as a boolean read as one, and every key it takes as a
    number (or a list of numbers) checked to be one (see the module doc)."""
    keys = bool_keys(fn) & set(params)
    numbers = {k: parts for k, parts in number_keys(fn).items() if k in params}
    if not keys and not numbers:
        return dict(params)
    from hookrun.config.param_values import as_bool, as_number

    return {k: as_bool(v, k, where) if k in keys else as_number(v, numbers[k], k, where) if k in numbers else v
            for k, v in params.items()}


NUMBER_PARTS = {"float", "int", "None", "list", "list[int]", "list[float]"}


def number_keys(fn: Callable) -> dict[str, tuple[str, ...]]:
    """The parameters of `fn` annotated with numbers only (`float`, `int | None`, `int | list[int]`,
    ...): name -> the annotation's parts. An annotation with any other part is not checked."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    out = {}
    for name, p in params.items():
        if isinstance(p.annotation, str):
            parts = tuple(p.annotation.replace(" ", "").replace("Optional[", "None|").rstrip("]").split("|")) \
                if p.annotation.startswith("Optional[") else tuple(p.annotation.replace(" ", "").split("|"))
        else:
            parts = {float: ("float",), int: ("int",)}.get(p.annotation, ())
        if parts and set(parts) <= NUMBER_PARTS and set(parts) & {"float", "int"}:
            out[name] = parts
    return out
