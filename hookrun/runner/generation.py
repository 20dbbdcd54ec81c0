"""mode=generate: one `model.generate(**batch, **cfg.generate)` per batch instead of one forward.

    gen = Generation(kwargs, seed, width, eos, points, env.state)   # built by the generate kind
    out = gen.step(model, call)        # hooks fire at every model call; out.columns

The generate kind (hookrun.runner.kinds.generate_kind) checks the settings and builds a Generation.

Sampling is seeded per batch from (seed, batch number): the same config gives the same text, a
resumed run too; another batch size groups the prompts differently and changes sampled text.
The new tokens, their count and their text (where the dataset has a tokenizer) go under /samples.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hookrun.errors import ConfigError, RunError
from hookrun.hooks import HookPoint, StepState
from hookrun.hooks.tokens import CallTracker
from hookrun.runner.calls import CallSpec, ModelCall
from hookrun.runner.extra_forwards import first_batch

log = logging.getLogger("hookrun")


@dataclass
class Generated:
    """What one batch's generation adds to its StepRecord (the token map is the step's own:
    every model call's TokenMap in state.calls, hookrun.hooks.tokens)."""

    columns: dict[str, np.ndarray]  # per-sample: generated_ids, generated_length, ..._text


@dataclass
class Generation:
    """The settings of mode=generate, checked; step() generates one batch."""

    kwargs: dict[str, Any]
    seed: int
    width: int  # max_new_tokens: the columns of /samples/generated_ids
    eos: list[int]
    points: list[HookPoint]
    state: StepState
    tokenizer: Any = None
    decoder_only: bool = True

    def step(self, model: torch.nn.Module, call: ModelCall) -> Generated:
        batch = as_kwargs(call)
        if self.decoder_only:
            check_left_padded(batch, f"batch {self.state.step}", RunError)
        seed_batch(self.seed, self.state.step)
        with CallTracker(model, self.points, self.state, self.eos), torch.no_grad():
            out = model.generate(**batch, **self.kwargs)
        ids = out if isinstance(out, torch.Tensor) else out.sequences
        prompt = batch["input_ids"]
        new = ids[:, prompt.shape[1]:] if self.decoder_only else ids[:, 1:]  # an encoder-decoder's: after the start token
        return Generated(self.columns(prompt, batch.get("attention_mask"), new))

    def columns(self, prompt: torch.Tensor, mask: torch.Tensor | None, new: torch.Tensor) -> dict[str, np.ndarray]:
        new = new.cpu()
        lengths = torch.full((new.shape[0],), new.shape[1], dtype=torch.long)
        if self.eos and new.numel():
            hit = torch.isin(new, torch.tensor(self.eos))
            first = torch.where(hit.any(1), hit.float().argmax(1) + 1, lengths)  # up to and with the EOS token
            lengths = first
        ids = torch.full((new.shape[0], self.width), -1, dtype=torch.long)
        for i, n in enumerate(lengths.tolist()):
            ids[i, :n] = new[i, :n]
        mask = torch.ones_like(prompt) if mask is None else mask
        prompt_ids = [row[m.bool()].tolist() for row, m in zip(prompt.cpu(), mask.cpu(), strict=True)]
        columns = {
            "generated_ids": ids.numpy(),
            "generated_length": lengths.numpy(),
            "prompt_length": np.array([len(p) for p in prompt_ids], dtype=np.int64),
        }
        if self.tokenizer is not None:
            columns["prompt_text"] = np.array([decode(self.tokenizer, p) for p in prompt_ids], dtype=object)
            columns["generated_text"] = np.array([decode(self.tokenizer, ids[i, :n].tolist()) for i, n in
                                                  enumerate(lengths.tolist())], dtype=object)
        return columns


def pad_left(cfg: Any) -> None:
    """A dataset node with `padding_side` (data=text pads when it is built) pads on the left in
    mode=generate: a decoder-only model continues from the last position."""
    node = cfg.data.dataset
    if isinstance(node, dict) and node.get("padding_side") not in (None, "left"):
        log.info("mode=generate: data.dataset.padding_side=%s set to left", node["padding_side"])
        node["padding_side"] = "left"


def preflight(model: torch.nn.Module, loader: Any, spec: CallSpec, gen: Generation, device: torch.device) -> None:
    """The first batch must be left-padded, and generate must take the arguments (one token, one prompt)."""
    batch = as_kwargs(first_batch(loader, spec, loader.batch_size)[1])
    if gen.decoder_only:
        check_left_padded(batch, "the first batch", ConfigError)
    one = {k: v[:1].to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    config = getattr(model, "config", None)
    most = next((getattr(config, k) for k in ("n_positions", "max_position_embeddings")
                 if isinstance(getattr(config, k, None), int)), None)
    length, new = int(batch["input_ids"].shape[-1]), int(gen.kwargs.get("max_new_tokens") or 0)
    if gen.decoder_only and most is not None and length + new > most:  # (its position embedding would fail mid-run)
        raise ConfigError(f"generate.max_new_tokens={new}: the prompts' {length} tokens and {new} new ones pass the "
                          f"model's {most} positions; give generate.max_new_tokens <= {max(most - length, 0)} "
                          f"(or shorter prompts: data.dataset.max_length)")
    args = {**gen.kwargs, "max_new_tokens": 1}
    args.pop("min_new_tokens", None)
    try:
        with torch.no_grad():
            model.generate(**one, **args)
    except (TypeError, ValueError, AttributeError) as exc:
        text = " ".join(str(exc).split())
        raise ConfigError(f"generate: model.generate refused its arguments ({', '.join(sorted(gen.kwargs))}): "
                          f"{text[:300] + ('...' if len(text) > 300 else '')}") from None


def as_kwargs(call: ModelCall) -> dict[str, Any]:
    """The batch's forward call as generate's keyword arguments: the first positional input is the
    prompt's input_ids, keyword inputs stay as they are."""
    kwargs = dict(call.kwargs)
    if call.args:
        if len(call.args) > 1 or "input_ids" in kwargs:
            raise ConfigError(f"mode=generate: the batch gives {len(call.args)} positional input(s); generate takes "
                              f"input_ids and keywords (data.inputs: {{input_ids: input_ids, attention_mask: attention_mask}})")
        kwargs["input_ids"] = call.args[0]
    if not isinstance(kwargs.get("input_ids"), torch.Tensor):
        raise ConfigError(f"mode=generate: a batch needs input_ids (the prompt's token ids); it gives {', '.join(kwargs) or 'none'}: "
                          f"name them with data.inputs={{input_ids: KEY, attention_mask: KEY}}")
    return kwargs


def check_left_padded(batch: dict, where: str, error: type[Exception]) -> None:
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise error(f"mode=generate: {where} is right-padded (attention_mask has 0 after 1); a decoder-only model "
                    f"continues from the last position, so pad prompts on the left (tokenizer padding_side='left', "
                    f"data.dataset.padding_side=left)")


def seed_batch(seed: int, step: int) -> None:
    """Seed torch's generators from (seed, batch number): each batch samples the same way on every run."""
    digest = hashlib.blake2b(f"{seed},{step}".encode(), digest_size=8).digest()
    torch.manual_seed(int.from_bytes(digest, "little") >> 1)


def decode(tokenizer: Any, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids, skip_special_tokens=True)
    except TypeError:
        return tokenizer.decode(ids)
