"""Building objects from `_target_` nodes: the model, the dataset, the loss, user actions and ops.

    model = build_model({"_target_": "torchvision.models.resnet18", "weights": None})

This is the one module that calls hydra.utils.instantiate; every failure becomes a ConfigError
naming the config key and the target.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookrun.errors import ConfigError, HookrunError, close_matches, not_a_state_dict

if TYPE_CHECKING:
    from hydra.errors import InstantiationException


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
        raise ConfigError(f"{where}: {_instantiation_message(exc, node['_target_'])}") from None


def _instantiation_message(exc: InstantiationException, target: str) -> str:
    from hydra.errors import InstantiationException

    cause = exc.__cause__
    while cause is not None and isinstance(cause, InstantiationException):
        cause = cause.__cause__
    # the whole message on one line: Hydra wraps some sentences over several lines (a blocklisted target)
    text = " ".join(str(exc).split()).replace(", set env var HYDRA_FULL_ERROR=1 to see chained stack trace.", "")
    if "Error locating target" in text:
        return f"cannot import {target!r} ({_closest_names(target)})"
    if cause is not None:
        return f"building {target!r} failed: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    return text


def _closest_names(target: str) -> str:
    """What the importable part of a dotted `target` holds that is close to the rest of it: the
    hint of 'cannot import' (torchvision.models.resnet181 -> torchvision.models.resnet18, ...)."""
    parts = str(target).split(".")
    obj, found = None, 0
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        name = ".".join(parts[:i])
        try:
            obj, found = importlib.import_module(name), i
            break
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name != name and not name.startswith(exc.name + "."):
                return f"importing {name} needs {exc.name!r}, which is not installed"
            continue
        except Exception as exc:  # the module is there but fails on import
            return f"importing {name} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if obj is None:
        return f"no module {parts[0]!r}: is the package installed and the name spelt right?"
    for part in parts[found:]:
        nxt = getattr(obj, part, None)
        if nxt is None:
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = close_matches(part, names, n=3)
            owner = ".".join(parts[:parts.index(part, found)])
            if close:
                return f"{owner} has no {part!r}; did you mean {' or '.join(f'{owner}.{c}' for c in close)}?"
            return f"{owner} has no {part!r}; is the name spelt right?"
        obj = nxt
    return "is the package installed and the name spelt right?"


_KINDS_OF: dict[str, tuple[str, Any]] = {}  # a kind's name -> (the module of imports: whose KIND registered it, it)


def import_modules(names: list[str]) -> None:
    """Import the modules listed under `imports:` (so their registered actions exist); a module's own
    `KIND = KindPlugin(...)` (a kind's package, as docs/architecture.md writes one) is registered, as its
    entry point would find it, where the module has not called register_plugin itself."""
    from hookrun.config.plugins import KindPlugin, loaded_plugins, register_plugin

    for name in names:
        try:
            kind = getattr(importlib.import_module(name), "KIND", None)
            if isinstance(kind, KindPlugin):
                try:
                    register_plugin(kind)
                except ConfigError as exc:
                    module, held = _KINDS_OF.get(kind.name, ("", None))
                    before = module if any(k is held for k in loaded_plugins()) else ""
                    raise ConfigError(f"imports: {name}.KIND: {exc}".replace("(registered before)", f"({before}.KIND, "
                                      f"named in imports: before it)" if before else "(registered before)")) from None
                _KINDS_OF[kind.name] = (name, kind)
        except ImportError as exc:
            raise ConfigError(f"imports: cannot import {name!r}: {exc}") from None
        except HookrunError:  # (register_plugin's refusal, already one line)
            raise
        except Exception as exc:  # the module raised as it ran (--verbose: the traceback)
            raise ConfigError(f"imports: {name!r} failed as it was imported: {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0]}") from exc


def build_model(node: Mapping, device: torch.device, progress: bool = True, where: str = "model") -> nn.Module:
    """The model a `model:` node builds, on `device`, in eval mode; `progress=False` keeps a
    library's weight-loading bar (transformers') off, as the run's own bar is. `where`: the node's key
    in the config, as errors name it (a kind's second model: similarity.with.model)."""
    from hookrun.models import loading_bars

    node = dict(node)
    checkpoint = node.pop("checkpoint", None)
    try:
        with loading_bars(progress):
            model = build(node, where)
    except ConfigError as exc:
        if node.get("weights") and ("URLError" in str(exc) or "HTTPError" in str(exc)):
            raise ConfigError(_weights_message(node, str(exc), where)) from None
        if node.get("weights_backbone") and ("URLError" in str(exc) or "HTTPError" in str(exc)):
            raise ConfigError(f"{where}.weights_backbone={node['weights_backbone']}: the backbone's pretrained weights are "
                              f"not in the torch hub cache ({Path(torch.hub.get_dir()) / 'checkpoints'}) and cannot be "
                              f"downloaded; set {where}.weights_backbone=null for a random-init backbone") from None
        raise
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{where}: {node['_target_']!r} built a {type(model).__name__}, not a torch.nn.Module")
    if checkpoint:
        load_checkpoint(model, str(checkpoint), where)
    return model.to(device).eval()


def live_model(model: Any, device: torch.device) -> nn.Module:
    """A model object given to run(cfg, model=...): checked, moved to the device, in eval mode."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"run(model=...): got a {type(model).__name__}, not a torch.nn.Module")
    return model.to(device).eval()


def _weights_message(node: Mapping, error: str, key: str = "model") -> str:
    """Pretrained weights that are not cached and cannot be downloaded: say where torchvision looks."""
    where = Path(torch.hub.get_dir()) / "checkpoints"
    try:
        from torchvision.models import get_model_weights

        weights = node["weights"]
        enum = get_model_weights(node["_target_"].rsplit(".", 1)[-1])
        url = (enum[weights] if isinstance(weights, str) and weights in enum.__members__ else enum.DEFAULT).url
        where = where / url.rsplit("/", 1)[-1]
    except Exception:  # not a torchvision builder: name the folder only
        pass
    reason = error.split("Error: ", 1)[-1]
    return (f"{key}.weights={node['weights']}: the pretrained weights are not in the torch hub cache and cannot be "
            f"downloaded ({reason}); put the file at {where} (TORCH_HOME moves the cache), or give "
            f"{key}.weights=null {key}.checkpoint=PATH with a state_dict file of your own")


def load_checkpoint(model: nn.Module, path: str, key: str = "model") -> None:
    """Load a plain state_dict with weights_only=True: no arbitrary object is ever unpickled."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"{key}.checkpoint: no file {path!r}") from None
    except Exception as exc:  # UnpicklingError and friends: not a plain tensor file
        raise ConfigError(
            f"{key}.checkpoint: {path!r} is not a plain state_dict ({not_a_state_dict(exc)}); save one with "
            f"torch.save(model.state_dict(), path)"
        ) from None
    for wrapper in ("state_dict", "model"):  # (a training checkpoint's dict around the state_dict)
        if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
            state = state[wrapper]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(
            f"{key}.checkpoint: {path!r} holds a {type(state).__name__}, not a state_dict of tensors "
            f"(save it with torch.save(model.state_dict(), path))"
        )
    try:  # the keys as the modules read them: a BatchNorm fills in the num_batches_tracked an older file lacks
        result = model.load_state_dict(state, strict=False)
        missing, unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    except RuntimeError as exc:  # shape mismatches: said where the keys fit
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if not (missing or unexpected):
            detail = [line.strip() for line in str(exc).splitlines()[1:3]]
            raise ConfigError(f"{key}.checkpoint: {path!r} does not fit {type(model).__name__}: {' '.join(detail)}") from None
    if missing or unexpected:
        raise ConfigError(
            f"{key}.checkpoint: {path!r} does not fit {type(model).__name__}: missing keys "
            f"{missing[:5]}, unexpected keys {unexpected[:5]}{_prefix_hint(state, missing)}"
        )


def _prefix_hint(state: Mapping, missing: list[str]) -> str:
    """'; the keys all start with 'module.' ...' where one wrapper's prefix on every key is all that differs."""
    for prefix in ("module.", "_orig_mod.", "model."):
        if state and all(k.startswith(prefix) for k in state) and set(missing) <= {k[len(prefix):] for k in state}:
            return (f"; every key starts with {prefix!r} (a DataParallel/DDP, torch.compile or Lightning wrapper's "
                    f"state_dict): save the inner model's state_dict, or the keys without {prefix!r}")
    return ""


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
