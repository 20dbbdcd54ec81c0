"""Losses for mode=grad: callables (output, target) -> scalar.

    loss: {_target_: hookrun.runner.losses.cross_entropy, _partial_: true, output_key: null}

The model's output may be a tensor, a dict or ModelOutput (transformers), a dataclass or a tuple:
`output_key` picks the tensor (a key, an attribute or a position); without it a structured output
gives its `logits`, and a tuple its first element. `lm` is next-token cross-entropy over the
batch's `input_ids`, ignoring padding (the batch's `attention_mask`). A float16 or bfloat16 output is
read in float32 (as transformers' own losses read logits): the loss of a half model is not rounded
to 3 digits, and its gradient reaches the model in the model's dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from hookrun.errors import RunError, foreign_code, foreign_failure


def _need_target(target: Any, name: str) -> torch.Tensor:
    if target is None:
        raise RunError(f"loss={name} needs a target, but the items carry none (data.target); use loss=sum or loss=lm")
    if not isinstance(target, torch.Tensor):
        raise RunError(f"loss={name} needs a tensor target, the batch's target is a {type(target).__name__}")
    return target


def pick_output(output: Any, key: str | int | None, name: str) -> torch.Tensor:
    """The tensor of `output` the loss works on (see the module docstring)."""
    if isinstance(output, torch.Tensor):
        if key is not None:
            raise RunError(f"loss={name}: loss.output_key={key!r}, but the model returns one tensor, which has no keys "
                           f"or positions; remove loss.output_key")
        return output
    if dataclasses.is_dataclass(output) and not isinstance(output, Mapping):
        output = {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
    if isinstance(output, Mapping):
        keys = [k for k, v in output.items() if v is not None]
        want = key if key is not None else ("logits" if "logits" in output else None)
        if want is None and len(keys) == 1:
            want = keys[0]
        if want is None or want not in output or not isinstance(output[want], torch.Tensor):
            raise RunError(f"loss={name}: the model's output is a {type(output).__name__} with keys {', '.join(map(str, keys))}; "
                           f"set loss.output_key to the one to use" + (f" ({want!r} is not a tensor there)" if want is not None else ""))
        return output[want]
    if isinstance(output, tuple | list) and output:
        at = 0 if key is None else key
        if not isinstance(at, int) or not -len(output) <= at < len(output) or not isinstance(output[at], torch.Tensor):
            kinds = ", ".join(type(o).__name__ for o in output[:6])
            raise RunError(f"loss={name}: the model's output is a {type(output).__name__} of {len(output)} ({kinds}); "
                           f"set loss.output_key to the position of a tensor")
        return output[at]
    raise RunError(f"loss={name}: cannot use the model's output, a {type(output).__name__}; "
                   f"give loss=custom with a function that takes it")


def cross_entropy(output: Any, target: Any, output_key: str | int | None = None) -> torch.Tensor:
    """Mean cross entropy over the batch."""
    logits = pick_output(output, output_key, "cross_entropy")
    target = _need_target(target, "cross_entropy")
    if logits.dim() < 2 or logits.shape[0] != target.shape[0] or tuple(target.shape[1:]) != tuple(logits.shape[2:]):
        raise RunError(f"loss=cross_entropy: logits of shape {tuple(logits.shape)} do not fit targets of shape "
                       f"{tuple(target.shape)} (one class index per sample); for a language model use loss=lm")
    return F.cross_entropy(wide(logits), class_indices(logits, target, "cross_entropy", ignore=-100))


def sum_output(output: Any, target: Any = None, output_key: str | int | None = None) -> torch.Tensor:
    """The sum of every output element: each gradient is then d(sum)/d(x)."""
    return wide(pick_output(output, output_key, "sum")).sum()


def target_logit(output: Any, target: Any, output_key: str | int | None = None) -> torch.Tensor:
    """The sum over the batch of each sample's logit at its target class (as Grad-CAM uses)."""
    logits = pick_output(output, output_key, "target_logit")
    target = _need_target(target, "target_logit")
    if logits.dim() != 2 or target.numel() != logits.shape[0]:
        raise RunError(f"loss=target_logit: logits of shape {tuple(logits.shape)} do not fit targets of shape "
                       f"{tuple(target.shape)} (batch, classes logits, one class index per sample); set "
                       f"loss.output_key, or for a language model use loss=lm")
    return wide(logits.gather(1, class_indices(logits, target, "target_logit").view(-1, 1))).sum()


def class_indices(logits: torch.Tensor, target: torch.Tensor, name: str, ignore: int | None = None) -> torch.Tensor:
    """The target as class indices along logits' dim 1: a float target with fractions, or an index outside
    the classes (other than `ignore`, cross-entropy's ignore_index), is one line, not truncated or torch's
    IndexError."""
    if target.is_floating_point() and not torch.equal(target, target.round()):
        frac = target[target != target.round()].flatten()[0].item()
        raise RunError(f"loss={name}: the targets are class indices, and the batch's are {target.dtype} with "
                       f"fractions ({frac:g}); give integer class indices, or loss=custom for another kind of target")
    target = target.long()
    bad = (target < 0) | (target >= logits.shape[1])
    if ignore is not None:
        bad &= target != ignore
    if bad.any():
        raise RunError(f"loss={name}: target {target[bad].flatten()[0].item()} is not a class of logits of shape "
                       f"{tuple(logits.shape)}: class indices run 0 to {logits.shape[1] - 1} (dim 1)")
    return target.to(logits.device)


def lm(output: Any, target: Any = None, batch: Any = None, output_key: str | int | None = None) -> torch.Tensor:
    """Next-token cross-entropy: logits at position t predict input_ids at t + 1; padded
    positions (attention_mask 0) are left out of the mean."""
    logits = pick_output(output, output_key, "lm")
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise RunError("loss=lm needs dict items with input_ids (data=text gives them)")
    ids = batch["input_ids"].to(logits.device)
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(ids.shape):
        raise RunError(f"loss=lm: logits of shape {tuple(logits.shape)} do not fit input_ids of shape {tuple(ids.shape)} "
                       f"(expected (batch, tokens, vocab)); set loss.output_key")
    labels = ids[:, 1:].clone()
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        labels[~next_token_pairs(mask.to(logits.device))] = -100
    return F.cross_entropy(wide(logits[:, :-1].reshape(-1, logits.shape[-1])), labels.reshape(-1), ignore_index=-100)


def wide(t: torch.Tensor) -> torch.Tensor:
    """A float16 or bfloat16 tensor in float32 (a loss's arithmetic); any other as it is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def next_token_pairs(mask: torch.Tensor) -> torch.Tensor:
    """(batch, tokens) attention_mask -> (batch, tokens - 1) bool: the pairs (t, t + 1) whose both tokens
    are real, the ones a next-token loss counts (padding on either side left out): loss=lm, evaluate's
    and patching's ce."""
    m = mask.bool()
    return m[:, 1:] & m[:, :-1]


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax over the last dim, in float32 at least (the block kinds' ce, kl and logprob metrics)."""
    return torch.log_softmax(wide(logits), dim=-1)


def call_loss(loss: Callable[..., Any], takes_batch: bool, output: Any, call: Any) -> Any:
    """loss(output, target), with batch= where the loss takes it (grad's and evaluate's losses): an exception
    of the loss's own (the user's or torch's) is one line (loss_failure), not its traceback."""
    with foreign_code(lambda exc: loss_failure(loss, call.target, exc)):
        return loss(output, call.target, batch=call.batch) if takes_batch else loss(output, call.target)


def loss_failure(loss: Any, target: Any, exc: Exception) -> RunError:
    """The loss's own exception as one line; where the batch has no target, what data.target finds and how
    to name one (dict items with `labels`, as transformers names them, are not found by `auto`)."""
    name = loss_name(loss)
    if target is None:
        return foreign_failure(f"loss: the batch has no target (data.target=auto takes item[1] of a tuple, or a dict "
                               f"item's `target` or `label` key; name yours, e.g. data.target=labels), and "
                               f"{name}(output, None) raised", exc)
    return foreign_failure(f"loss: {name}(output, target) raised", exc)


def loss_name(loss: Any) -> str:
    """The loss's name in messages: its function's (a partial's too), else its class's."""
    fn = getattr(loss, "func", loss)  # (a partial's function)
    return getattr(fn, "__name__", type(fn).__name__)
