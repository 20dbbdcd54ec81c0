"""The one-line errors of the data: a dataset item or data.collate that raised, items that cannot be
stacked into one batch. Loaded only where such an error is raised (the loop, prepare(), a kind's
own reads of the data).

    raise data_failure(exc, "data: loading the first 1 item(s) before the run failed:") from exc
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hookrun.errors import ConfigError, HookrunError, RunError


def collate_failure(items: list, indices: list[int], exc: Exception, custom: bool) -> HookrunError:
    """The line for items the collate function could not batch (`custom`: data.collate's, else default_collate's)."""
    if custom:
        return RunError(f"data.collate failed on the samples {indices}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}")
    message = collate_message(items, indices, exc)
    return (ConfigError if "hold None" in message else RunError)(message)


def collate_message(items: list, indices: list[int], exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "NoneType" in text:
        return (f"data: the samples {indices} hold None (a missing target?), which cannot be batched; the dataset "
                f"(data.dataset) must return a tensor there, or set data.target=null and data.inputs to the parts "
                f"that exist, or give data.collate={{_target_: hookrun.data.collate_lists, _partial_: true}}")
    shapes = sorted({str(tuple(x.shape)) for x in first_tensors(items)})
    return (f"data: the samples {indices} cannot be stacked into one batch ({text}; shapes {', '.join(shapes[:4])}); "
            f"resize or pad them to one size, use data.batch_size=1, or give data.collate="
            f"{{_target_: hookrun.data.collate_lists, _partial_: true}} (a model that takes a list, such as detection)")


def first_tensors(items: list) -> list[torch.Tensor]:
    out = []
    for item in items:
        first = item
        while isinstance(first, tuple | list) and first:
            first = first[0]
        if isinstance(first, Mapping):
            first = next((v for v in first.values() if isinstance(v, torch.Tensor)), None)
        if isinstance(first, torch.Tensor):
            out.append(first)
    return out


def data_failure(exc: Exception, what: str, hint: str = "") -> RunError:
    """One line for an error of the data (a dataset item or data.collate that raised), in the form of
    a failed forward's: `what`, the exception's type and message (a DataLoader worker's traceback text:
    its last line), `hint`; the traceback stays behind HYDRA_FULL_ERROR=1 or --verbose."""
    text = str(exc).strip()
    if "DataLoader worker" in text:  # "Caught KeyError in DataLoader worker process 0. Original Traceback: ..."
        line = text.splitlines()[-1]
    else:
        line = f"{type(exc).__name__}: {' '.join(text.split())}"
    line = line if len(line) <= 400 else line[:400] + "..."
    return RunError(f"{what} {line}{hint} (the traceback: HYDRA_FULL_ERROR=1 or --verbose)")


def load_failure(exc: Exception, step: int, loader) -> RunError:
    """A dataset item (or data.collate) raised while batch `step` was loaded: one line (data_failure)."""
    lo = step * loader.batch_size
    n = len(loader.dataset.dataset)
    hint = f" (the dataset's len() is {n}: does it have that many items?)" if isinstance(exc, IndexError) else ""
    return data_failure(exc, f"data: loading batch {step} (items {lo}..{min(lo + loader.batch_size, n) - 1}) failed:", hint)


def described(value: Any) -> str:
    """A call's input as its shape and dtype (`[2, 8] int64`), a dict's as `{key: ...}` (ModelCall.describe)."""
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).replace('torch.', '')}"
    return "{" + ", ".join(f"{k}: {described(v)}" for k, v in value.items()) + "}" if isinstance(value, Mapping) \
        else type(value).__name__
