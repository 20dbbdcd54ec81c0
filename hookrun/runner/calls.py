"""How items become a batch (Collate: the loader's collate_fn) and a batch the forward call: which parts are
the model's inputs, which the target.

    spec = CallSpec(inputs=None, target="auto")        # the defaults below
    call = spec.split(batch).to(device); output = call.run(model)

| item              | default call                       | default target                |
|-------------------|------------------------------------|-------------------------------|
| tensor            | model(x)                           | none                          |
| tuple / list      | model(item[0])                     | item[1] (where there is one)  |
| dict              | model(**item) minus the target key | item["target"] or ["label"]   |
| (dict, label)     | model(**item[0])                   | item[1]                       |

`data.inputs` overrides the inputs: a list of keys or positions passed positionally
(`[input_ids]`, `[0, 2]`) or a mapping `argument: key` passed as keywords
(`{input_ids: input_ids, attention_mask: attention_mask}`); `data.target` is a key, a position or
null. The batch's `attention_mask` (a dict item's key, or the input that data.inputs passes as
`attention_mask`) is handed to the actions (token rows, masked reductions).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from hookrun.errors import ConfigError, HookrunError, RunError, foreign_code, foreign_failure
from hookrun.hooks import StopForward

AUTO = "auto"
DICT_TARGETS = ("target", "label")
MASK_KEY = "attention_mask"


@dataclass
class ModelCall:
    """One batch as the forward call: `model(*args, **kwargs)`, with the target beside it."""

    args: tuple
    kwargs: dict
    target: Any = None
    batch: Any = None  # the whole collated batch, with the keyword inputs under their argument names (loss=lm reads input_ids)
    attention_mask: torch.Tensor | None = None

    def run(self, model: nn.Module, who: str = "the model", error: type[HookrunError] = RunError) -> Any:
        """The forward, as model_forward() runs it (the model's own exception: one line naming `who`, of type `error`)."""
        kwargs = self.kwargs
        if isinstance(self.attention_mask, torch.Tensor):  # (left-padded rows: their position_ids)
            from hookrun.runner.token_inputs import with_positions

            kwargs = with_positions(model, kwargs, self.attention_mask)
        return model_forward(model, self.args, kwargs, self.kwargs, who, error)

    def describe(self) -> str:
        """The call's inputs as `input_ids=[2, 8] int64, ...` (shapes and dtypes, no values)."""
        from hookrun.runner.data_errors import described  # (an error's line)

        return ", ".join([described(a) for a in self.args] + [f"{k}={described(v)}" for k, v in self.kwargs.items()])

    def to(self, device: torch.device) -> ModelCall:
        """Every tensor of the call, nested ones too, on `device`."""
        return ModelCall(to_device(self.args, device), to_device(self.kwargs, device), to_device(self.target, device),
                         to_device(self.batch, device), to_device(self.attention_mask, device))

    def tensors(self) -> list[torch.Tensor]:
        """The top-level tensor inputs (grad mode makes the floating ones require grad)."""
        return [t for t in (*self.args, *self.kwargs.values()) if isinstance(t, torch.Tensor)]


def model_forward(model: nn.Module, args: tuple, kwargs: dict, shown: dict | None = None, who: str = "the model", error: type[HookrunError] = RunError) -> Any:
    """model(*args, **kwargs) for every kind: the model's own exception is one RunError line naming the model, the
    inputs (`shown`, else kwargs: shapes and dtypes) and its message (the original as its __cause__); `who` names
    the model (a kind's second model, by its key), `error` the line's type (ConfigError: a check before any batch)."""
    def failure(exc: Exception) -> HookrunError:  # (the inputs are described only when it raised)
        return error(str(foreign_failure(f"{who}'s forward failed: {type(model).__name__}("
                                         f"{ModelCall(tuple(args), kwargs if shown is None else shown).describe()}) raised", exc)))

    with foreign_code(failure, passed=(StopForward,)):  # StopForward: early_stop's cut
        return model(*args, **kwargs)


def to_device(obj: Any, device: torch.device) -> Any:
    """`obj` with every tensor inside it (tuples, lists, dicts, nested) moved to `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, tuple | list):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


@dataclass
class CallSpec:
    """`data.inputs` and `data.target`, checked against the first item and applied to batches."""

    inputs: Any = None  # None: the default; a list of keys/positions; a mapping argument -> key
    target: Any = AUTO  # "auto": the default; a key or position; None: no target
    item_kind: str = ""  # "tensor", "tuple" or "dict": set by check() from the first item
    unpassed_mask: bool = False  # the items' attention_mask, which the forward takes, is not passed (check_forward)

    def __post_init__(self) -> None:
        if self.inputs is not None and not isinstance(self.inputs, list | tuple | Mapping):
            raise ConfigError(f"data.inputs: expected a list of keys or positions, or a mapping argument: key; got {self.inputs!r}")

    def check(self, item: Any) -> None:
        """Refuse, before the run, an item the spec cannot split (the first item of the dataset)."""
        kind = self.item_kind = _kind(item)
        if kind in ("dict", "tuple"):
            t = self.target_key(item)
            if t is not None and _get(item, t, "data.target") is None:
                raise ConfigError(f"data.target: the items' target ({t!r}) is None, which cannot be batched; the "
                                  f"dataset (data.dataset) returns no target: set data.target=null, or return a tensor there")
        if kind == "other":
            raise ConfigError(f"data.dataset: an item is a {type(item).__name__}; hookrun needs a tensor, a tuple/list or a dict "
                              f"of tensors (add a transform such as torchvision.transforms.ToTensor, or a tokenizer)")
        if kind == "tensor":
            if self.inputs is not None or self.target not in (AUTO, None):
                raise ConfigError("data.inputs / data.target: the items are plain tensors, which are the input "
                                  "as they are; remove data.inputs and data.target")
            return
        for where, key in self._wanted(item):
            _get(item, key, where)
        first = self._input_keys(item)
        values = [_get(item, k, "data.inputs") for k in (first.values() if isinstance(first, Mapping) else first)]
        if not any(_has_tensor(v) for v in values):
            hf = ("a Hugging Face datasets.Dataset gives lists: pass ds.with_format('torch'); otherwise "
                  if any(isinstance(v, list) for v in values) else "")  # (its rows, unformatted, are lists)
            raise ConfigError(f"data.inputs: none of the model's inputs ({', '.join(map(str, first))}) holds a tensor "
                              f"(got {', '.join(type(v).__name__ for v in values)}); {hf}add a transform such as "
                              f"torchvision.transforms.ToTensor, or choose other keys with data.inputs")

    def check_forward(self, model: nn.Module, item: Any) -> None:
        """Keyword inputs must be arguments of `model.forward` (or it takes **kwargs): refused before
        any batch with the items' keys, the forward's arguments and the data.inputs line that maps them."""
        if self.item_kind not in ("dict", "tuple"):
            return
        keys = self._input_keys(item)
        first = _get(item, keys[0], "data.inputs") if not isinstance(keys, Mapping) and len(keys) == 1 else None
        if isinstance(item, Mapping) or isinstance(keys, Mapping) or isinstance(first, Mapping):  # (keyword inputs)
            from hookrun.runner.token_inputs import check_keywords

            target = self.target_key(item) if isinstance(item, Mapping) else None
            self.unpassed_mask = check_keywords(model, item, keys, first, self.inputs, target)

    def _wanted(self, item: Any) -> list[tuple[str, Any]]:
        out = []
        if self.target not in (AUTO, None):
            out.append(("data.target", self.target))
        if self.inputs is not None:
            keys = self.inputs.values() if isinstance(self.inputs, Mapping) else self.inputs
            out.extend(("data.inputs", k) for k in keys)
        return out

    def target_key(self, batch: Any) -> Any:
        if self.target != AUTO:
            return self.target
        if isinstance(batch, Mapping):
            return next((k for k in DICT_TARGETS if k in batch), None)
        if isinstance(batch, tuple | list) and len(batch) > 1:
            return 1
        return None

    def _input_keys(self, batch: Any) -> list | Mapping:
        if self.inputs is not None:
            return self.inputs
        if isinstance(batch, Mapping):
            target = self.target_key(batch)
            return {k: k for k in batch if k != target}
        return [0]

    def split(self, batch: Any) -> ModelCall:
        """The call for one collated batch."""
        if isinstance(batch, torch.Tensor) or self.item_kind == "tensor":  # a list, where collate made one
            return ModelCall((batch,), {}, None, batch)
        keys = self._input_keys(batch)
        if isinstance(keys, Mapping):
            args, kwargs = (), {str(a): _get(batch, k, "data.inputs") for a, k in keys.items()}
        else:
            args, kwargs = tuple(_get(batch, k, "data.inputs") for k in keys), {}
            if len(args) == 1 and isinstance(args[0], Mapping):  # (features_dict, label): the dict is the keywords
                args, kwargs = (), {str(k): v for k, v in args[0].items()}
        t = self.target_key(batch)
        target = scalars(_get(batch, t, "data.target")) if t is not None else None
        if isinstance(batch, Mapping) and any(batch.get(k) is not v for k, v in kwargs.items()):  # data.inputs renames
            batch = {**batch, **kwargs}  # the batch as the model takes it: the actions' mask, loss=lm's input_ids
        mask = batch.get(MASK_KEY) if isinstance(batch, Mapping) else kwargs.get(MASK_KEY)  # tuples: by data.inputs
        if self.unpassed_mask:  # (dict items whose mask the forward takes)
            from hookrun.runner.token_inputs import refuse_unpassed

            refuse_unpassed(self.inputs, mask, "a batch")
        return ModelCall(args, kwargs, target, batch, mask if isinstance(mask, torch.Tensor) else None)




class Collate:
    """The loader's collate_fn: the indices as a tensor, the items through `fn` (default_collate
    unless data.collate names another), with one clear line where the items cannot be batched."""

    def __init__(self, fn: Callable | None = None) -> None:
        self.fn = fn or default_collate
        self.custom = fn is not None

    def __call__(self, pairs: list[tuple[int, Any]]) -> tuple[torch.Tensor, Any]:
        indices = torch.tensor([i for i, _ in pairs], dtype=torch.long)
        items = [item for _, item in pairs]
        if not self.custom:
            refuse_mixed(items, indices.tolist())
        try:
            return indices, self.fn(items)
        except (RuntimeError, TypeError) as exc:
            from hookrun.runner.data_errors import collate_failure

            raise collate_failure(items, indices.tolist(), exc, self.custom) from None


def _form(item: Any) -> str:
    if isinstance(item, Mapping):
        return f"a dict of {', '.join(sorted(map(str, item)))}"
    if isinstance(item, tuple | list):
        return f"a {type(item).__name__} of {len(item)}"
    return f"a {type(item).__name__}"


def refuse_mixed(items: list, indices: list[int]) -> None:
    """Items of one batch must have one form (the same keys, the same length): default_collate drops
    a key the first item lacks (a target of later items lost) and fails obscurely on the rest."""
    first = _form(items[0]) if items else ""
    j = next((j for j, item in enumerate(items) if _form(item) != first), None)
    if j is not None:
        raise RunError(f"data: the items of one batch differ: sample {indices[0]} is {first}, sample {indices[j]} "
                       f"is {_form(items[j])}; every item must have the same parts: each gives a target, or none does "
                       f"(data.target=null)")


def first_items(dataset: Dataset, size: int) -> list[Any]:
    """The dataset's first `size` items (fewer where it has fewer), read before any batch: an item
    that raises is one line (data_failure), as in the loop."""
    n = min(size, len(dataset))  # type: ignore[arg-type]
    try:
        return [dataset[i] for i in range(n)]
    except HookrunError:
        raise
    except Exception as exc:
        from hookrun.runner.data_errors import data_failure

        raise data_failure(exc, f"data: loading the first {n} item(s) before the run failed:") from exc


def scalars(target: Any) -> Any:
    """A batch's target as a tensor where a collate function left it a list of numbers (collate_lists: the
    images as a list, each item's class an int): the loss takes it and /samples/target keeps it. Other
    targets (detection's dicts, strings) stay as they are."""
    if isinstance(target, list | tuple) and target and all(
            isinstance(t, numbers.Real) or (isinstance(t, torch.Tensor) and t.dim() == 0) for t in target):  # (numpy's too)
        return torch.stack([torch.as_tensor(t) for t in target]) if isinstance(target[0], torch.Tensor) else torch.tensor(target)
    return target


def position_limit(model: nn.Module) -> tuple[int, str] | None:
    """(positions, the table's name) of the model's learned position table (GPT-2's wpe, BERT's
    position_embeddings, OPT's embed_positions); None without one."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in ("wpe", "position_embeddings", "embed_positions"):
            # (OPT's table starts at `offset`, RoBERTa's after its padding index)
            skip = int(getattr(module, "offset", 0) or 0) + (module.padding_idx + 1 if module.padding_idx is not None else 0)
            return module.num_embeddings - skip, name
    return None


def _kind(item: Any) -> str:
    return ("tensor" if isinstance(item, torch.Tensor) else "dict" if isinstance(item, Mapping)
            else "tuple" if isinstance(item, tuple | list) and len(item) else "other")


def _get(batch: Any, key: Any, where: str) -> Any:
    if isinstance(batch, Mapping):
        if key not in batch:
            raise ConfigError(f"{where}: the items have no key {key!r}; their keys: {', '.join(map(str, batch))}")
        return batch[key]
    if not isinstance(key, int) or isinstance(key, bool):
        raise ConfigError(f"{where}: {key!r} is not a position; the items are tuples of {len(batch)}, so use 0 to {len(batch) - 1}")
    if not -len(batch) <= key < len(batch):
        raise ConfigError(f"{where}: position {key} does not exist; the items are tuples of {len(batch)} (0 to {len(batch) - 1})")
    return batch[key]


def _has_tensor(obj: Any) -> bool:
    parts = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, tuple | list) else ()
    return isinstance(obj, torch.Tensor) or any(_has_tensor(v) for v in parts)
