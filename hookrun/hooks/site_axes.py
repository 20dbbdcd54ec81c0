"""Axis names of attention's op sites from the structure of its calls, not from sizes.

    calls = [Call("matmul", 0, {"input.0": q, "input.1": kT}, {"output": scores}), ...]   # one forward
    site_axes(calls)[("matmul", 0, "output")]  # ("head", "query", "key")

When a sequence is as long as a head is wide (32 tokens, head_dim 32), a (B, H, 32, 32) tensor may
be the scores or the per-head values: sizes cannot tell. The calls of one forward can. The tensor a
softmax (PATTERN_FNS) turns into probabilities, 4-D, is the pattern; following tensor identity:
  * backwards from the softmax's input, each op that keeps its operand's shape (scale, mask add,
    masked_fill, a dtype cast) carries the scores, up to the contraction that made them
    (q @ k^T: its result is `head, query, key`, its first operand the queries `head, token, feature`);
  * forwards from the probabilities, each shape-keeping op (dropout, cast) carries the pattern; a
    contraction whose first operand is the pattern (pattern @ v) gives `head, token, feature`, as
    do the values it reads.
  * a contraction's operand is named where the call that made that very tensor is too (LLaMA's
    `transpose.3`, the keys transposed after the GQA repeat, is `head, feature, token`).
An op that permutes axes (transpose, permute) ends a chain: its axes are not the same ones. The
check of op sites (site_check.check_sites_run) runs one forward before the first batch and hands
each site point these names (HookPoint.axes); dims.meaning prefers them to its size rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hookrun.store import PATTERN, PATTERN_FNS

PER_HEAD = ("head", "token", "feature")  # queries, keys, values and their product with the pattern
CONTRACTIONS = {"matmul", "bmm", "einsum", "baddbmm", "mm", "tensordot", "__matmul__"}
PERMUTES = {"transpose", "transpose_", "permute", "swapaxes", "swapdims", "movedim", "moveaxis", "t", "mT", "mH",
            "adjoint", "view", "reshape", "flatten", "unflatten", "expand", "repeat", "narrow", "split", "chunk",
            "unbind", "select", "index_select", "gather"}


@dataclass
class Call:
    """One torch call of a module's own forward: FN, its number k, tensor arguments and results by role."""

    fn: str
    k: int
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


def site_axes(calls: list[Call]) -> dict[tuple[str, int, str], tuple[str, ...]]:
    """(FN, k, role) -> the names of that tensor's axes after the sample, where the structure says."""
    out: dict[tuple[str, int, str], tuple[str, ...]] = {}
    made_by = {id(t): i for i, c in enumerate(calls) for t in c.outputs.values()}
    for i, c in enumerate(calls):
        probs = next(iter(c.outputs.values()), None)
        if c.fn not in PATTERN_FNS or probs is None or probs.dim() != 4 or len(c.outputs) != 1:
            continue
        _mark(out, c, c.outputs, PATTERN)
        scores = _first(c.inputs, probs.shape)
        if scores is not None:
            out[(c.fn, c.k, scores[0])] = PATTERN
            _backwards(out, calls, made_by, scores[1], i)
        _forwards(out, calls, i + 1, probs, made_by)
    return out


def _backwards(out: dict, calls: list[Call], made_by: dict, t: torch.Tensor, before: int) -> None:
    while (j := made_by.get(id(t), before)) < before:
        c = calls[j]
        _mark(out, c, c.outputs, PATTERN)
        if c.fn in CONTRACTIONS:  # q @ k^T: the queries, then the keys with their axes swapped
            roles = list(c.inputs)
            if len(roles) >= 2:
                _operand(out, calls, made_by, c, roles[0], PER_HEAD)
                _operand(out, calls, made_by, c, roles[1], ("head", "feature", "token"))
            return
        if c.fn in PERMUTES:
            return
        nxt = _first(c.inputs, t.shape)
        if nxt is None:
            return
        out[(c.fn, c.k, nxt[0])] = PATTERN
        t, before = nxt[1], j


def _operand(out: dict, calls: list[Call], made_by: dict, c: Call, role: str, names: tuple[str, ...]) -> None:
    """A contraction's operand and, where a call of the forward made that very tensor, the result of
    that call too (the keys' transpose, the queries' rotary add, the values' repeat for GQA)."""
    out[(c.fn, c.k, role)] = names
    j = made_by.get(id(c.inputs[role]))
    if j is not None:
        _mark(out, calls[j], {r: t for r, t in calls[j].outputs.items() if t is c.inputs[role]}, names)


def _forwards(out: dict, calls: list[Call], start: int, probs: torch.Tensor, made_by: dict) -> None:
    carried = {id(probs)}
    for c in calls[start:]:
        role = next((r for r, t in c.inputs.items() if id(t) in carried), None)
        if role is None:
            continue
        if c.fn in CONTRACTIONS:
            if role == next(iter(c.inputs)):  # pattern @ v
                out[(c.fn, c.k, role)] = PATTERN
                for other in list(c.inputs)[1:]:
                    _operand(out, calls, made_by, c, other, PER_HEAD)
                _mark(out, c, c.outputs, PER_HEAD)
            continue
        result = next(iter(c.outputs.values()), None)
        if c.fn in PERMUTES or result is None or len(c.outputs) != 1 or result.shape != c.inputs[role].shape:
            continue
        out[(c.fn, c.k, role)] = PATTERN
        _mark(out, c, c.outputs, PATTERN)
        carried.add(id(result))


def _first(tensors: dict[str, torch.Tensor], shape: torch.Size) -> tuple[str, torch.Tensor] | None:
    return next(((r, t) for r, t in tensors.items() if t.dim() == 4 and t.shape == shape), None)


def _mark(out: dict, c: Call, tensors: dict[str, torch.Tensor], names: tuple[str, ...]) -> None:
    for role, t in tensors.items():
        if t.dim() == 4:
            out[(c.fn, c.k, role)] = names
