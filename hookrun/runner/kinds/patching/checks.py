"""The metric's inputs checked against the model's output, before any cell runs.

    check_metric_inputs(block, logits, items)   # logits: the first base run's output

A position outside the sequence, or an answer / wrong id outside the output's classes, would be
read as another index (position 50 of 8 tokens as 2, -9 as 7) or end in an IndexError: each is
one ConfigError naming the key, the value and the range. A model whose output has no token axis
(an image classifier's (items, classes)) has no position to read: ce, which reads next tokens,
is refused there; for ce, an item with fewer than 2 real tokens (check_ce), whose mean
over no next-token pair would be NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hookrun.errors import ConfigError
from hookrun.runner.kinds.patching.metrics import user_metric
from hookrun.runner.losses import next_token_pairs


def check_metric_inputs(block: Any, logits: torch.Tensor, items: Mapping[str, torch.Tensor], mask_key: str | None = None) -> None:
    """`mask_key`: the items' key every forward's attention_mask comes from; a position it marks as padding is refused."""
    if block.user_metric is not None:
        _check_differentiable(block, logits, items)
        return
    if logits.dim() not in (2, 3):
        raise ConfigError(f"patching.metric.name={block.metric!r}: the model's output has shape {tuple(logits.shape)}; the "
                          f"built-in metrics read (items, classes) or (items, tokens, vocabulary) logits: give a metric of "
                          f"your own ({{_target_: my_pkg.metric}}, one value per item)")
    classes = logits.shape[-1]
    if logits.dim() == 2 and block.metric == "ce":
        raise ConfigError(f"patching.metric.name='ce' reads the next token at every position, and the model's output "
                          f"{tuple(logits.shape)} has no token axis; choose logit, logit_diff, logprob, prob or kl")
    if logits.dim() == 3 and block.metric != "ce":
        _check_position(block.position, items, logits.shape[1], logits.shape[0])
        _check_real_token(block.position, items, mask_key, logits.shape[1])
    if block.metric in ("logit_diff", "logprob", "prob", "logit"):
        keys = [("answer", block.answer)] + ([("wrong", block.wrong)] if block.metric == "logit_diff" else [])
        for name, key in keys:
            ids = items[key]
            if ids.dtype == torch.bool or ids.is_floating_point() and not torch.equal(ids, ids.round()):
                raise ConfigError(f"patching.metric.{name}={key!r}: the items' {key!r} are not whole numbers (class ids)")
            if ids.numel() != logits.shape[0]:
                raise ConfigError(f"patching.metric.{name}={key!r}: expected one id per item, got shape {tuple(ids.shape)}")
            bad = ((ids < 0) | (ids >= classes)).reshape(-1)
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                raise ConfigError(f"patching.metric.{name}={key!r}: item {i} has id {int(ids.reshape(-1)[i])}, outside the "
                                  f"model's {classes} output classes (0..{classes - 1})")


GRADIENT_METHODS = ("atp", "atp_ig", "eap", "eap_ig")


def _check_differentiable(block: Any, logits: torch.Tensor, items: Mapping[str, torch.Tensor]) -> None:
    """A metric of the user's own whose value has no gradient (an argmax, a comparison, a .detach()) under a method that
    takes d metric / d activation: one ConfigError after the base runs, on their logits, before the gradient pass (it
    ended in torch's 'element 0 of tensors does not require grad' traceback there)."""
    if block.method not in GRADIENT_METHODS or not logits.is_floating_point():
        return
    with torch.enable_grad():
        value = user_metric(block.user_metric, block.metric, logits.detach().requires_grad_(True), items)
    if isinstance(value, torch.Tensor) and not value.requires_grad:  # (a value of the wrong shape: measure says so)
        raise ConfigError(f"patching.metric {block.metric}: its value has no gradient with respect to the logits (it "
                          f"returned a tensor that does not require grad: an argmax, a comparison, a .detach()), and "
                          f"method={block.method} takes d metric / d activation; return a differentiable value per item, "
                          f"such as a logit difference" + (", or use method=exact" if block.method.startswith("atp") else ""))


def check_ce(block: Any, items: Mapping[str, torch.Tensor], mask_key: str | None) -> None:
    """ce is each item's mean over its next-token pairs (t, t + 1 both real tokens): an item with fewer
    than 2 real tokens has none, and its 0/0 made every cell NaN. One ConfigError naming the item, before
    any forward. (evaluate's ce and loss=lm pool the pairs of every item, where such an item adds none;
    patching's ce is a mean per item, so it has no value to leave out.)"""
    if block.user_metric is not None or block.metric != "ce" or items[block.clean].dim() != 2:
        return
    ids = items[block.clean]
    mask = items.get(mask_key) if mask_key else None
    if mask is not None and tuple(mask.shape) == tuple(ids.shape):
        real, pairs, where = mask.bool().sum(1), next_token_pairs(mask).sum(1), " (attention_mask)"
    else:
        real = pairs = torch.full((ids.shape[0],), ids.shape[1])
        pairs, where = pairs - 1, ""
    if bool((pairs < 1).any()):
        i = int((pairs < 1).nonzero()[0])
        raise ConfigError(f"patching.metric.name='ce': item {i} has {int(real[i])} real token(s){where}, so no next-token pair "
                          f"(t, t + 1) to measure: its ce would be 0/0 (NaN) in every cell; give each item at least 2 real "
                          f"tokens (evaluate and loss=lm pool the pairs of all items, where such an item adds none; "
                          f"patching's ce is each item's own mean), or drop item {i}")


def _check_position(position: Any, items: Mapping[str, torch.Tensor], tokens: int, n: int) -> None:
    span = f"the output has {tokens} position(s): 0..{tokens - 1}, or -{tokens}..-1 from the end"
    if isinstance(position, str):
        pos = items[position]
        if pos.dtype == torch.bool or pos.is_complex() or pos.is_floating_point() and not torch.equal(pos, pos.round()):
            flat = pos.reshape(-1)
            i = 0 if not pos.is_floating_point() else int((flat != flat.round()).nonzero()[0])
            raise ConfigError(f"patching.metric.position={position!r}: item {i} has position {flat[i].item()!r} "
                              f"({str(pos.dtype).replace('torch.', '')}), not a whole number; give each item's token "
                              f"position as an integer; {span}")
        if pos.numel() != n:
            raise ConfigError(f"patching.metric.position={position!r}: expected one position per item, got shape "
                              f"{tuple(pos.shape)} for {n} items")
        pos = pos.reshape(-1)
        bad = (pos < -tokens) | (pos >= tokens)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ConfigError(f"patching.metric.position={position!r}: item {i} asks for position {int(pos[i])}; {span}")
    elif not -tokens <= int(position) < tokens:
        raise ConfigError(f"patching.metric.position={position}: outside the sequence; {span}")


def _check_real_token(position: Any, items: Mapping[str, torch.Tensor], mask_key: str | None, tokens: int) -> None:
    """The metric read where the attention_mask marks padding (position -1 of a right-padded item) is the model's output
    at a pad token, not the prompt's: one line naming the item, as MIB reads each item's last real token instead."""
    mask = items.get(mask_key) if mask_key else None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[1] != tokens:
        return
    n = mask.shape[0]
    pos = items[position].reshape(-1).long() if isinstance(position, str) else torch.full((n,), int(position))
    pos = pos.to(mask.device) % tokens
    pad = mask[torch.arange(n, device=mask.device), pos] == 0
    if bool(pad.any()):
        i = int(pad.nonzero()[0])
        raise ConfigError(f"patching.metric.position={position!r}: item {i}'s position {int(pos[i])} is padding (its "
                          f"{mask_key!r} is 0 there), so the metric would read the model's output at a pad token; read "
                          f"each item's last real token: give the items a position key (mib_task's 'position') and "
                          f"metric.position: that key, or pad on the left")


def refuse_recording(points: list) -> None:
    """A hook that records (record, top_examples, logit_lens, a user's action with records = True) beside
    a patching block would record nothing: the run writes only its cells, and its forwards are packed
    copies of the items, not the data's batches. One ConfigError naming the hook, before any forward."""
    for p in points:
        for a in p.actions:
            if a.records:
                raise ConfigError(f"hooks.{p.hook}: its action {a.where} ({type(a).__name__}) records captures, but a "
                                  f"patching run writes only its grid's cells (its forwards are packed copies of the items, "
                                  f"not the data's batches), so it would record nothing; record in a run of its own (the "
                                  f"same hooks without the patching block), and keep beside patching only hooks that "
                                  f"change the forward (modify_output: splice, ...)")


def refuse_modifying(points: list, method: str) -> None:
    """An edges run (eap / eap_ig) takes each writer's contribution where the graph taps it (a head's at its
    output projection's input): a hook that changes the forward (modify_output, a splice) is not seen there,
    so the scores and faithfulness would be those of another model. One ConfigError, before any forward."""
    from hookrun.runner.kinds.patching.edges.spec import EDGE_METHODS

    if method not in EDGE_METHODS:
        return
    for p in points:
        for a in p.actions:
            if a.modifies:
                raise ConfigError(f"hooks.{p.hook}: its action {a.where} ({type(a).__name__}) changes the forward, but "
                                  f"an edges run (method {method}) takes the writers' contributions where the graph taps "
                                  f"them, which would not see the change; drop the hook, or change the model's weights instead")


def check_token_ids(model: Any, items: Mapping[str, torch.Tensor], keys: tuple[str, ...]) -> None:
    """A model that reads token ids through an embedding (a transformers model's input embeddings, a
    TransformerLens model's W_E) gets whole numbers within its vocabulary in each of `keys`, one sequence
    (T,) per item: a float id, one past the vocabulary or an item of shape [1, T] ended in the model's own
    error, with a traceback. Other models: unchecked."""
    vocab = _vocabulary(model)
    if vocab is None:
        return
    for key in dict.fromkeys(keys):
        ids = items[key]
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ConfigError(f"patching: the items' {key!r} are {str(ids.dtype).replace('torch.', '')}, and the model reads "
                              f"token ids through its embedding of {vocab}; give whole-number ids (torch.long)")
        if ids.dim() != 2:  # ([items, T]: one sequence per item; a tokenizer's return_tensors="pt" gives each [1, T])
            raise ConfigError(f"patching: the items' {key!r} have shape {tuple(ids.shape[1:])} each, and the model reads one "
                              f"sequence of token ids per item, shape (T,); give each item its 1-D ids (for a tokenizer's "
                              f"return_tensors='pt' output, ['input_ids'][0] or .squeeze(0))")
        bad = (ids < 0) | (ids >= vocab)
        if bool(bad.any()):
            item, *_ = (int(i) for i in bad.nonzero()[0])
            raise ConfigError(f"patching: item {item}'s {key!r} holds token id {int(ids[bad][0])}, outside the model's "
                              f"vocabulary of {vocab} (0..{vocab - 1})")


def _vocabulary(model: Any) -> int | None:
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except (NotImplementedError, AttributeError):
            emb = None
        if isinstance(emb, torch.nn.Embedding):
            return emb.num_embeddings
    w_e = getattr(getattr(model, "embed", None), "W_E", None)  # (TransformerLens)
    return int(w_e.shape[0]) if isinstance(w_e, torch.Tensor) and w_e.dim() == 2 else None
