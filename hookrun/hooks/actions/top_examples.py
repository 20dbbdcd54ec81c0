"""top_examples: for every feature, the k largest activations of the whole run, streamed.

    actions: [{name: top_examples, k: 20, context: 12}]     # at MODULE.sae.latents, a neuron layer, ...
    open_run(p).top_examples("transformer.h.3.sae.latents", 7)  # [{value, sample, position, context, at}]

The hooked tensor (the output of a forward hook, the input of a forward_pre hook; `what` picks
another) has its features on its last axis, except a 4-D map (batch, channel, height, width),
whose features are its channels (a channels-last map's, HookPoint.last, are read as such):

| tensor               | one activation per                 | position          |
|----------------------|------------------------------------|-------------------|
| (batch, feature)     | sample                             | none (-1)         |
| (batch, T, feature)  | sample and token (padding left out) | index in the padded row |
| (batch, C, H, W)     | sample: the channel's max over H, W | none (-1)         |

Exact: the result equals sorting every activation of the run, largest first; ties (equal
values) go to the earlier sample, then the earlier position. NaN never enters. Memory is
O(features x k): each batch is merged into the running top-k with torch.topk on the tensor's
device, over keys that make every activation distinct (the value's bits, then its order of
arrival), in chunks of at most CHUNK_ELEMENTS. The running top-k is the action's state: saved
at each flush, reloaded on resume; at the end of a complete run it is written as the captures
`top.values` (float32), `top.samples` and `top.positions` (int64), one row of k per feature (a
feature with fewer than k activations: NaN and -1 in the slots left). A many-rank run's view
holds the top-k of the ranks' top-k (store/run_state.merge_features).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hookrun.config.schema import Mode
from hookrun.errors import ConfigError, RunError
from hookrun.hooks import Event, family
from hookrun.hooks.actions import ACTIONS, Action
from hookrun.hooks.actions.batch_axis import batch_second
from hookrun.store.records import Capture, CaptureKey

EMPTY = torch.iinfo(torch.int64).min  # the key of an empty slot (and of padding, NaN)
CHUNK_ELEMENTS = 1 << 24  # features x candidates merged at once
LOW = 1 << 32
KINDS = ("samples", "tokens", "channels")  # what one activation is per (the state stores the number)


def order_keys(values: torch.Tensor) -> torch.Tensor:
    """int64 keys that sort as the float32 values do: the value's bits in the high half, the low
    half left for the arrival order (filled by the caller). NaN gets EMPTY."""
    v = values.float() + 0.0  # -0.0 becomes +0.0: equal values, equal keys
    bits = v.view(torch.int32)
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: reversed, below the positives
    return (bits.to(torch.int64) * LOW).masked_fill_(torch.isnan(v), EMPTY)


@ACTIONS.register("top_examples")
class TopExamples(Action):
    fits = frozenset({"forward", "forward_pre"})
    records = True

    def __init__(self, point, hook_type, env, where: str = "", k: int = 20, context: int = 12,
                 what: str | None = None) -> None:
        super().__init__(point, hook_type, env, where)
        for name, value, low in (("k", k, 1), ("context", context, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{self.where}: top_examples {name}={value!r}; expected a whole number >= {low}")
        self.k, self.context = k, context
        self.what = what or ("input" if hook_type.name == "forward_pre" else "output")
        self.values: torch.Tensor | None = None  # (features, k) float32, largest first
        self.samples: torch.Tensor | None = None  # (features, k) int64, -1: empty
        self.positions: torch.Tensor | None = None  # (features, k) int64, -1: no position
        self.kind = ""  # "tokens", "samples" or "channels": fixed at the first batch
        env.stateful.append(self)

    def _pick(self, tensors: dict) -> tuple[str, Any]:
        for role in (self.what, f"{self.what}.0"):
            if isinstance(tensors.get(role), torch.Tensor):
                return role, tensors[role]
        return self.what, None

    def check_mode(self, mode: Mode) -> None:
        if mode is Mode.generate:
            raise ConfigError(f"{self.where}: top_examples does not run in mode=generate (each new token is a model call "
                              f"of its own); run it with mode=eval on the texts")

    def check_tensor(self, role: str, tensor: Any) -> None:
        """Before the first batch (one sample's forward): a feature axis, and no k above the
        activations a feature can get in the whole run (its samples, times the sample's tokens)."""
        self._check_rank(role, tensor)
        planned = self.env.planned_samples
        if role not in (self.what, f"{self.what}.0") or not isinstance(tensor, torch.Tensor) or planned is None:
            return
        n, tokens = len(planned), tensor.shape[1] if tensor.dim() == 3 else 1
        if self.k > n * tokens:
            each = f"{n} samples x {tokens} tokens" if tensor.dim() == 3 else f"{n} samples"
            raise ConfigError(f"{self.where}: top_examples k={self.k}: this run gives each feature of {self.point.module} "
                              f"at most {n * tokens} activations ({each}); give k <= {n * tokens}")

    def _check_rank(self, role: str, tensor: Any) -> None:
        if role in (self.what, f"{self.what}.0") and isinstance(tensor, torch.Tensor) and tensor.dim() not in (2, 3, 4):
            raise ConfigError(f"{self.where}: top_examples at {self.point.module}: its {role} has shape "
                              f"{tuple(tensor.shape)}, without a feature axis; hook a tensor of (batch, feature), "
                              f"(batch, tokens, feature) or (batch, channel, height, width)")

    def reset(self) -> None:
        self.values = self.samples = self.positions = None
        self.kind = ""

    def __call__(self, ev: Event) -> None:
        role, t = self._pick(ev.tensors)
        if t is None:
            raise RunError(f"{self.where}: top_examples: {ev.where} has no tensor {self.what}; it has: "
                           f"{', '.join(ev.tensors) or 'none'}")
        if ev.call:  # a module called twice in one forward: one top-k per feature would hold one call's, or mix them
            raise RunError(f"{self.where}: top_examples: {ev.module} runs more than once in one forward (this is call {ev.call + 1}: "
                           f"a shared module, or one called in a loop), and its features' top examples would be one "
                           f"call's; hook a module that runs once per forward (python -m hookrun.modules shows the calls)")
        if self.point.site is not None and self.point.site[1] is None and ev.module != f"{self.point.module}.0":
            raise RunError(f"{self.where}: top_examples: {self.point.module} is called more than once in one forward "
                           f"({ev.module} is one more call), and one top-k per feature would mix the calls; name one "
                           f"call ({self.point.module}.0, {ev.module}): each gets its own top examples")
        if getattr(ev.state.call_tokens, "call", 0):  # hookrun.capture around model.generate: a new token's pass
            raise RunError(f"{self.where}: top_examples does not run around model.generate (each new token is a model "
                           f"call of its own, without its position); call the model on the texts instead")
        self._check_rank(role, t)
        if t.dim() == 4 and family(role) in self.point.last:  # channels last (timm's Swin): its channels to axis 1
            t = t.movedim(-1, 1)
        second = batch_second(ev, role, t, ev.state.batch_size, getattr(self.env, "model", None), self.point.site is not None)
        if second and second[0]:  # a sequence-first module's (tokens, batch, ...): each sample's own tokens
            t = t.transpose(0, 1)
        with torch.no_grad():
            self.add(t.detach(), ev.state)

    def add(self, t: torch.Tensor, state: Any) -> None:
        """Merge one batch's activations into the running top-k."""
        b = t.shape[0]
        kind = "channels" if t.dim() == 4 else "tokens" if t.dim() == 3 else "samples"
        if t.dim() == 4:
            t = t.float().amax(dim=(2, 3))
        t = t.reshape(b, -1, t.shape[-1])  # (batch, positions, features)
        n_pos, n_feat = t.shape[1], t.shape[2]
        if self.values is None:
            self.kind = kind
            self.values = torch.full((n_feat, self.k), float("nan"), device=t.device)
            self.samples = torch.full((n_feat, self.k), -1, dtype=torch.int64, device=t.device)
            self.positions = torch.full_like(self.samples, -1)
        elif self.values.shape[0] != n_feat:
            raise RunError(f"{self.where}: top_examples at {self.point.module}: {n_feat} features in batch "
                           f"{state.step}, {self.values.shape[0]} before")
        dev = self.values.device
        keys = order_keys(t.to(dev)).reshape(b * n_pos, n_feat)
        mask = state.attention_mask
        if kind == "tokens" and mask is not None and tuple(mask.shape) == (b, n_pos):  # padding never enters
            keys[~mask.to(dev).bool().reshape(-1)] = EMPTY
        index = state.sample_index if state.sample_index is not None else torch.arange(b)
        sample = index.to(dev).long().repeat_interleave(n_pos)
        position = torch.arange(n_pos, device=dev).repeat(b) if kind == "tokens" else torch.full_like(sample, -1)
        vals = t.to(dev).float().reshape(b * n_pos, n_feat)
        step = max(self.k, CHUNK_ELEMENTS // max(1, n_feat) - self.k)  # (at least k: a large k merges once per k rows, not per row)
        for lo in range(0, b * n_pos, step):  # rows arrive in (sample, position) order
            self._merge(keys[lo:lo + step].T, vals[lo:lo + step].T, sample[lo:lo + step], position[lo:lo + step])

    def _merge(self, keys: torch.Tensor, vals: torch.Tensor, sample: torch.Tensor, position: torch.Tensor) -> None:
        """keys, vals: (features, n) of n new activations, after the running k."""
        n_feat, n = keys.shape
        dev = keys.device
        old = order_keys(self.values)
        # the low half: k + n - 1 - arrival, so that of equal values the earlier arrival is larger
        arrival = torch.arange(self.k + n - 1, -1, -1, device=dev, dtype=torch.int64)
        all_keys = torch.cat([old, keys], dim=1) + arrival  # EMPTY + arrival stays below every real key
        top = torch.topk(all_keys, self.k, dim=1).indices
        empty = torch.gather(all_keys, 1, top) < EMPTY + LOW
        old_slot = top < self.k  # from the running top-k, else the j-th new activation
        j = (top - self.k).clamp(min=0)
        at = top.clamp(max=self.k - 1)
        self.values = torch.where(old_slot, torch.gather(self.values, 1, at), torch.gather(vals, 1, j)).masked_fill(empty, float("nan"))
        self.samples = torch.where(old_slot, torch.gather(self.samples, 1, at), sample[j]).masked_fill(empty, -1)
        self.positions = torch.where(old_slot, torch.gather(self.positions, 1, at), position[j]).masked_fill(empty, -1)

    def state(self) -> dict[str, Any] | None:
        if self.values is None:
            return {}
        return {"values": self.values.clone(), "samples": self.samples.clone(), "positions": self.positions.clone(),
                "kind": np.array(KINDS.index(self.kind))}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        if "values" not in state:
            return
        self.values = torch.from_numpy(np.asarray(state["values"], dtype=np.float32))
        self.samples = torch.from_numpy(np.asarray(state["samples"], dtype=np.int64))
        self.positions = torch.from_numpy(np.asarray(state["positions"], dtype=np.int64))
        self.kind = KINDS[int(state["kind"])]

    def finish(self) -> list[Capture]:
        if self.values is None:
            return []
        attrs = {"k": self.k, "context": self.context, "kind": self.kind, "merge": "top_k",
                 "merge_order": "top.values,top.samples,top.positions"}
        out = []
        for role, value in (("top.values", self.values), ("top.samples", self.samples), ("top.positions", self.positions)):
            key = CaptureKey(self.point.hook, self.point.module, self.point.type, role, 0)
            out.append(Capture(key, value.cpu(), False, attrs=dict(attrs), dims=("feature", "rank"), features=True))
        return out
