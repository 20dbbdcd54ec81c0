"""logit_lens: what the hooked residual stream would predict, through the model's own final norm
and unembedding, per sample and position.

    hooks:
      lens:
        at: transformer.h.*
        actions: [{name: logit_lens, norm: transformer.ln_f, unembed: lm_head, top_k: 5,
                   target: input_ids, target_shift: 1}]      # the target: the next token

For a hooked tensor x of (batch, T, width) (a forward hook's output, a forward_pre hook's input;
`what` picks another, `output.0` is taken where the output is a tuple), with
lp = log_softmax(unembed(norm(translator(x)))) over the vocabulary, it records:

| role                | rows x ...           | what                                                      |
|---------------------|----------------------|-----------------------------------------------------------|
| lens.top_ids        | sample x T x top_k   | the top_k token ids of lp, largest first                  |
| lens.top_logprobs   | sample x T x top_k   | their log-probabilities                                   |
| lens.target_logprob | sample x T           | lp of the target token (NaN where there is none)          |
| lens.target_rank    | sample x T           | how many tokens lp puts strictly above it (0: the top; -1: none) |
| lens.kl_to_final    | sample x T           | KL(final || lens) = sum p_final (log p_final - lp), nats  |

`target: KEY` names an item key: a (T,) tensor gives the target id at each position, a scalar
one id for every position of the sample (integer ids: a float target is refused, and so is one
of neither one id nor one per token); `target_shift: s` reads the id at position t + s (1:
the next token of input_ids; less than the first item's tokens); a position on padding, or whose
target lies past the end or on padding, has none.
A target id outside the vocabulary (0..V-1) is refused (the first item before any batch, a later
one when its batch comes), never clamped into it; `ignore_index: -100` marks ids that stand for
"no target" (labels padded with -100): those positions have none (NaN log-probability, rank -1).
`top_k` is at most the vocabulary; `norm` must be a norm (lens_modules.check_norm: LayerNorm,
RMSNorm, TransformerLens' LayerNormPre; not a block, GELU, Dropout or Identity).
No target: the two target roles are left out. The final distribution is the model's own: the
unembed module's output in the same forward (a forward hook on it, added by the first lens of a
run), through the step the model's forward takes after it (Gemma 2's softcap, Cohere's and
Granite's scale: lens_modules.logit_transform), which each layer's logits take too; the lens of
every hooked layer is computed when it arrives, in chunks of positions of at most CHUNK_ELEMENTS
logits, so no (batch, T, vocab) tensor exists per layer. The norm and unembed are called as their
`forward` (no hook of the run fires inside them).
`translator:` is the seam for a tuned lens (a per-layer affine map applied to x first): today
only the identity (null) is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hookrun.config.schema import Mode
from hookrun.errors import ConfigError, RunError
from hookrun.hooks import Event, flatten
from hookrun.hooks.actions import ACTIONS, Action, ActionEnv
from hookrun.hooks.actions.lens_modules import (
    check_norm,
    check_unembed,
    find_module,
    linear_shape,
    logit_transform,
)
from hookrun.store.records import Capture, CaptureKey

CHUNK_ELEMENTS = 1 << 22  # logits of one chunk of positions (4M: 80 positions of a 50k vocabulary)


class FinalLogits:
    """The unembed module's output in each forward, shared by the run's lenses: a plain forward
    hook that hands the final logits to every lens waiting for them (no copy of them is made).
    `post`: what the model's forward does to them before returning them (lens_modules.logit_transform),
    applied to the final logits here and to each lens's logits in emit."""

    def __init__(self, unembed: nn.Module, env: ActionEnv, post: Any = None) -> None:
        self.pending: list[tuple[LogitLens, torch.Tensor, dict]] = []
        self.post, self.unembed = post, unembed
        self.handle = unembed.register_forward_hook(self._fired)
        env.hold.on_close(lambda: self.handle.remove())

    def last(self) -> None:
        """Move the hook behind the unembed's forward hooks registered after it (the run's own
        modify_output on it): the final distribution is the output the model returns."""
        if next(reversed(self.unembed._forward_hooks), None) != self.handle.id:
            self.handle.remove()
            self.handle = self.unembed.register_forward_hook(self._fired)

    def _fired(self, module: nn.Module, args: Any, out: Any) -> None:
        if not self.pending:
            return
        logits = next(iter(flatten(out, "output").values()), None)
        if logits is None:
            raise RunError("logit_lens: the unembed module returned no tensor")
        with torch.no_grad():  # the model's output logits: each lens takes their log_softmax chunk by chunk
            pending, self.pending = self.pending, []
            logits = logits.detach() if self.post is None else self.post(logits.detach())
            for lens, x, seen in pending:
                lens.emit(x, logits, seen)


@ACTIONS.register("logit_lens")
class LogitLens(Action):
    fits = frozenset({"forward", "forward_pre"})
    records = True
    keeps_mask = True  # the run stores the batches' attention_mask in /samples: the pictures leave padding out
    whole_forward = True  # the unembed's output is the final distribution: early_stop is refused

    def __init__(self, point, hook_type, env, where: str = "", norm: str | None = None, unembed: str | None = None,
                 top_k: int = 5, target: str | None = None, target_shift: int = 0, translator: Any = None,
                 what: str | None = None, ignore_index: int | None = None) -> None:
        super().__init__(point, hook_type, env, where)
        model = env.model
        if model is None:
            raise ConfigError(f"{self.where}: logit_lens needs the model (built by make_plan)")
        self.norm = find_module(model, norm, self.where, "norm")
        self.unembed = find_module(model, unembed, self.where, "unembed")
        check_unembed(self.unembed, unembed, model, self.where)
        self.width, self.vocab = linear_shape(self.unembed)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"{self.where}: logit_lens top_k={top_k!r}; expected a whole number >= 1")
        if self.vocab is not None and top_k > self.vocab:
            raise ConfigError(f"{self.where}: logit_lens top_k={top_k} is larger than the vocabulary of {unembed} "
                              f"({self.vocab} tokens); give at most {self.vocab}")
        check_norm(self.norm, norm, self.width, model, self.where)
        if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
            raise ConfigError(f"{self.where}: logit_lens ignore_index={ignore_index!r}; give the whole number that marks "
                              f"'no target' in the items (e.g. -100), or null")
        self.ignore = ignore_index
        if isinstance(target_shift, bool) or not isinstance(target_shift, int) or target_shift < 0:
            raise ConfigError(f"{self.where}: logit_lens target_shift={target_shift!r}; expected a whole number >= 0")
        if target is not None and (not isinstance(target, str) or not target):
            raise ConfigError(f"{self.where}: logit_lens target={target!r}; give an item key (e.g. input_ids)")
        if translator is not None:
            raise ConfigError(f"{self.where}: logit_lens translator={translator!r}: only the identity (null) exists "
                              f"yet; a tuned lens's per-layer maps will be given here")
        self.top_k, self.target, self.shift, self.names = top_k, target, target_shift, (norm, unembed)
        self.item_ids: int | None = None  # how many ids the first item's target gives, where it is (n,)
        self.what = what or ("input" if hook_type.name == "forward_pre" else "output")
        key = f"logit_lens:{unembed}"
        if key not in env.shared:
            env.shared[key] = FinalLogits(self.unembed, env, logit_transform(model))
        self.final: FinalLogits = env.shared[key]

    def translate(self, x: torch.Tensor) -> torch.Tensor:
        """The translator seam: the identity (a tuned lens maps each layer's x here)."""
        return x

    def check_item(self, item: Any) -> None:
        if self.target is None:
            return
        if not isinstance(item, Mapping) or self.target not in item:
            keys = ", ".join(map(str, item)) if isinstance(item, Mapping) else f"none (items are {type(item).__name__}s)"
            raise ConfigError(f"{self.where}: logit_lens target={self.target!r} is not a key of the items; their keys: {keys}")
        ids = item[self.target]
        if isinstance(ids, int | float | torch.Tensor):
            ids = torch.as_tensor(ids)
            self.check_ids(ids, "the first item")
            if ids.dim() > 1:
                raise ConfigError(f"{self.where}: logit_lens target={self.target!r}: the first item's target has shape "
                                  f"{tuple(ids.shape)}; give a scalar (one id for the sample) or a (tokens,) tensor "
                                  f"(an id per position)")
            self.item_ids = ids.shape[0] if ids.dim() == 1 else None

    def check_ids(self, ids: torch.Tensor, which: str) -> None:
        """Whole-number ids, every one (but ignore_index) within the vocabulary, or one line naming what is wrong."""
        error = ConfigError if which == "the first item" else RunError
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise error(f"{self.where}: logit_lens target={self.target!r}: {which} holds a {str(ids.dtype)[6:]} tensor, "
                        f"not token ids; give whole-number ids (an integer tensor, e.g. torch.long)")
        if self.vocab is None:
            return
        real = ids[ids != self.ignore] if self.ignore is not None else ids.reshape(-1)
        bad = real[(real < 0) | (real >= self.vocab)]
        if bad.numel():
            raise error(f"{self.where}: logit_lens target={self.target!r}: {which} holds id {int(bad[0])}, outside the "
                        f"vocabulary of {self.names[1]} (0..{self.vocab - 1}); a value that means 'no target' (such as "
                        f"-100 padding) is named with ignore_index: {int(bad[0])}")

    def check_mode(self, mode: Mode) -> None:
        if mode is Mode.generate:
            raise ConfigError(f"{self.where}: logit_lens does not run in mode=generate (each new token is a model call "
                              f"of its own); run it with mode=eval on the texts")

    def check_tensor(self, role: str, tensor: Any) -> None:
        if role not in (self.what, f"{self.what}.0") or not isinstance(tensor, torch.Tensor):
            return
        if tensor.dim() != 3 or (self.width is not None and tensor.shape[-1] != self.width):
            raise ConfigError(f"{self.where}: logit_lens at {self.point.module}: its {role} has shape "
                              f"{tuple(tensor.shape)}, but the unembedding takes (batch, tokens, {self.width}): "
                              f"hook a point whose tensor has the model's width (a block's output, the residual stream)")
        t = tensor.shape[1]
        if self.target is not None and self.shift >= t:
            raise ConfigError(f"{self.where}: logit_lens target_shift={self.shift} is past the first item's {t} tokens, so "
                              f"no position would have a target; give 0..{t - 1} (1: the next token)")
        if self.target is not None and self.item_ids == 1 and t > 1:  # (other lengths: a collate may pad them)
            raise ConfigError(f"{self.where}: logit_lens target={self.target!r}: the first item's target has shape (1,), "
                              f"its forward {t} tokens; give a scalar (tensor(5): one id for the sample) or one id per token")

    def __call__(self, ev: Event) -> None:
        role = next((r for r in (self.what, f"{self.what}.0") if isinstance(ev.tensors.get(r), torch.Tensor)), None)
        if role is None:
            raise RunError(f"{self.where}: logit_lens: {ev.where} has no tensor {self.what}; it has: "
                           f"{', '.join(ev.tensors) or 'none'}")
        if getattr(ev.state.call_tokens, "call", 0):  # hookrun.capture around model.generate: a new token's pass
            raise RunError(self.around_generate())
        x = ev.tensors[role]
        self.check_tensor(role, x)
        stale = [p for p in self.final.pending if p[2]["step"] != ev.step]
        if stale:
            raise RunError(f"{self.where}: logit_lens: the unembed module did not run after {ev.where} in batch "
                           f"{stale[0][2]['step']} (early_stop, or an unembed the forward never calls)")
        seen = {"step": ev.step, "hook": ev.hook, "module": ev.module, "type": ev.type, "call": ev.call,
                "mask": ev.state.attention_mask, "targets": self.targets(ev.state, x)}
        if not self.final.pending:  # the forward's first lens: the unembed has not run yet
            self.final.last()
        self.final.pending.append((self, x.detach().clone(), seen))

    def around_generate(self) -> str:
        return (f"{self.where}: logit_lens does not run around model.generate (the unembed runs on the last position "
                f"only, and each new token is a model call of its own); call the model on the texts instead")

    def targets(self, state: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(target id, whether there is one) per (sample, position) of x."""
        if self.target is None:
            return None
        batch = state.batch
        if not isinstance(batch, Mapping) or not isinstance(batch.get(self.target), torch.Tensor):
            keys = [str(k) for k, v in batch.items() if isinstance(v, torch.Tensor)] if isinstance(batch, Mapping) else []
            has = f"its tensors: {', '.join(keys)}" if keys else "it has none (the model was called positionally)"
            raise RunError(f"{self.where}: logit_lens target={self.target!r}: the model call's keyword arguments hold no "
                           f"tensor {self.target!r}, {has}; pass the target as a keyword: model({self.target}=ids)")
        b, t = x.shape[:2]
        self.check_ids(batch[self.target], f"batch {state.step}")
        if self.shift >= t and state.step == 0:
            raise RunError(f"{self.where}: logit_lens target_shift={self.shift} is past the batch's {t} tokens, so no "
                           f"position would have a target; give 0..{t - 1} (1: the next token)")
        ids = batch[self.target].to(x.device).long()
        real = (ids != self.ignore) if self.ignore is not None else torch.ones_like(ids, dtype=torch.bool)
        ids = ids.masked_fill(~real, 0)
        mask = state.attention_mask  # a position on padding has no target, whatever it reads
        pad = mask.to(x.device).bool() if isinstance(mask, torch.Tensor) and tuple(mask.shape) == (b, t) else None
        if ids.dim() == 1:  # one id per sample: at every position
            ok = real[:, None].expand(b, t).clone()
            return ids[:, None].expand(b, t), ok if pad is None else ok & pad
        if ids.shape[:2] != (b, t):
            raise RunError(f"{self.where}: logit_lens target={self.target!r} has shape {tuple(ids.shape)}; expected "
                           f"({b},) or ({b}, {t}) to match the hooked tensor")
        ok = torch.zeros(b, t, dtype=torch.bool, device=x.device)
        out = torch.zeros(b, t, dtype=torch.long, device=x.device)
        s = self.shift
        if s < t:
            out[:, : t - s] = ids[:, s:]
            ok[:, : t - s] = real[:, s:]
            if pad is not None:  # the target's position too
                ok[:, : t - s] &= pad[:, s:]
        return out, ok if pad is None else ok & pad

    def emit(self, x: torch.Tensor, final: torch.Tensor, seen: dict) -> None:
        """The lens of x against the final logits (the model's output), chunk by chunk of positions."""
        b, t, _ = x.shape
        if final.dim() == 3 and final.shape[0] == b and final.shape[1] == 1 < t:  # generate's prompt pass: logits_to_keep
            raise RunError(self.around_generate())
        if final.shape[:2] != (b, t):
            raise RunError(f"{self.where}: logit_lens: the unembed's output has shape {tuple(final.shape)}, the "
                           f"hooked tensor {tuple(x.shape)}: their (batch, tokens) differ")
        vocab = final.shape[-1]
        rows = self.translate(x).reshape(b * t, -1)
        fin = final.reshape(b * t, vocab)
        tg = seen["targets"]
        tid, tok = (tg[0].reshape(-1), tg[1].reshape(-1)) if tg is not None else (None, None)
        out: dict[str, list[torch.Tensor]] = {k: [] for k in ("ids", "lps", "tlp", "rank", "kl")}
        step, wide = max(1, CHUNK_ELEMENTS // vocab), torch.promote_types(fin.dtype, torch.float32)  # (half: float32; float64 kept)
        for lo in range(0, b * t, step):
            z = self.unembed.forward(self.norm.forward(rows[lo:lo + step]))
            lp = torch.log_softmax((z if self.final.post is None else self.final.post(z)).to(wide), dim=-1)
            top = lp.topk(self.top_k, dim=-1)
            out["ids"].append(top.indices)
            out["lps"].append(top.values)
            f = torch.log_softmax(fin[lo:lo + step].to(wide), dim=-1)
            out["kl"].append((f.exp() * (f - lp)).sum(-1))
            if tid is not None:
                ids, ok = tid[lo:lo + step], tok[lo:lo + step]
                tlp = lp.gather(1, ids[:, None])[:, 0]  # (ids checked against the vocabulary; none-targets are 0)
                rank = (lp > tlp[:, None]).sum(-1)
                out["tlp"].append(tlp.masked_fill(~ok, float("nan")))
                out["rank"].append(rank.masked_fill(~ok, -1))
            del lp
        roles = {"lens.top_ids": ("ids", ("sample", "position", "rank")),
                 "lens.top_logprobs": ("lps", ("sample", "position", "rank")),
                 "lens.kl_to_final": ("kl", ("sample", "position"))}
        if tid is not None:
            roles |= {"lens.target_logprob": ("tlp", ("sample", "position")),
                      "lens.target_rank": ("rank", ("sample", "position"))}
        attrs = {"top_k": self.top_k, "norm": self.names[0], "unembed": self.names[1], "target": self.target or "", "target_shift": self.shift, "translator": "identity",
                 "ignore_index": "" if self.ignore is None else self.ignore}
        for role, (name, dims) in roles.items():
            value = torch.cat(out[name]).reshape(b, t, *out[name][0].shape[1:])
            key = CaptureKey(seen["hook"], seen["module"], seen["type"], role, seen["call"])
            self.env.captures.add(Capture(key, value, False, attrs=dict(attrs), dims=dims))  # (its torch_dtype: the tensor's)

