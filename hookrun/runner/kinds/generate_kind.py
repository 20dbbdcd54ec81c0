"""The generate kind (mode=generate): one `model.generate(**batch, **cfg.generate)` per batch.

    kind = GenerateKind(ctx)   # every check that can run before a batch, then one tiny generate()
    adds = kind.step(model, call, session)   # adds.samples: generated_ids, generated_length, ...

The generation itself (seeding, the columns under /samples, left padding) is
hookrun.runner.generation; this module is what a generate run does per batch and what it refuses.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError
from hookrun.runner.calls import ModelCall
from hookrun.runner.generation import Generation, as_kwargs, preflight
from hookrun.runner.kinds import KindContext, RunKind, StepAdds, register_kind


@register_kind("generate")
class GenerateKind(RunKind):
    mode = Mode.generate
    adds = ("samples/generated_ids", "samples/generated_length", "samples/prompt_length")

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        kwargs = settings(cfg)
        width = kwargs.get("max_new_tokens")
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ConfigError(f"generate.max_new_tokens must be a whole number >= 1 (the columns of "
                              f"/samples/generated_ids), got {width!r}")
        if kwargs.get("num_return_sequences", 1) != 1:
            raise ConfigError("generate.num_return_sequences: hookrun keeps one sequence per prompt; "
                              "run the sweep over seeds instead")

    def __init__(self, ctx: KindContext) -> None:
        self.ctx = ctx  # the base's __init__ would check the actions first: the model's checks come before
        cfg, model, points = ctx.cfg, ctx.model, ctx.points
        if not callable(getattr(model, "generate", None)):
            raise ConfigError(f"mode=generate: {type(model).__name__} has no generate() method; use a language model "
                              f"with one (a transformers ...ForCausalLM or GPT2LMHeadModel), or mode=eval")
        kwargs = settings(cfg)
        records = [p for p in points if any(a.records for a in p.actions)]
        if kwargs.get("num_beams", 1) != 1 and records:
            raise ConfigError(f"generate.num_beams={kwargs['num_beams']} with record (hooks.{records[0].hook}): beams "
                              f"reorder and drop rows at every step, so rows cannot be traced to one sample; record "
                              f"with num_beams=1")
        if kwargs.get("use_cache") is False and points:
            raise ConfigError("generate.use_cache=false: each model call would run the whole sequence again, so hooks "
                              "would see every token many times; keep the KV cache (the default)")
        self.check_actions()
        tokenizer = getattr(ctx.loader.dataset.dataset, "tokenizer", None)  # under the Indexed wrapper
        tokenizer = tokenizer if callable(getattr(tokenizer, "decode", None)) else None
        given = set(kwargs)
        for name in ("pad_token_id", "eos_token_id"):
            if kwargs.get(name) is None and getattr(tokenizer, name, None) is not None:
                kwargs[name] = getattr(tokenizer, name)
        check_token_ids(kwargs, model, given)
        eos = kwargs.get("eos_token_id", getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        eos = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])]
        if getattr(tokenizer, "padding_side", "left") != "left":
            tokenizer.padding_side = "left"  # a dataset that tokenizes in __getitem__ (data=text pads when built)
        decoder_only = not getattr(getattr(model, "config", None), "is_encoder_decoder", False)
        modify = [a for p in points for a in p.actions if a.positions != "all"]
        if not decoder_only and (records or modify):
            raise ConfigError(f"mode=generate: {type(model).__name__} is an encoder-decoder; record rows: token and "
                              f"positions follow a decoder-only model's calls. Steer it at every call (positions: "
                              f"all), without record")
        self.generation = Generation(kwargs, cfg.seed, kwargs["max_new_tokens"], eos, points, ctx.env.state,
                                     tokenizer, decoder_only)
        preflight(model, ctx.loader, ctx.spec, self.generation, next(model.parameters()).device)

    def step(self, model: nn.Module, call: ModelCall, session: Any) -> StepAdds:
        return StepAdds(samples=self.generation.step(model, call).columns, generated=True)

    def sample_forward(self, model: nn.Module, call: ModelCall) -> None:
        """generate() of two new tokens: the prompt's pass and one pass with the KV cache."""
        args = {**self.generation.kwargs, "max_new_tokens": 2}
        args.pop("min_new_tokens", None)
        with torch.no_grad():
            model.generate(**as_kwargs(call), **args)

    def file_bytes(self, n_samples: int) -> int:
        """generated_ids (int64 per new token), generated_length and prompt_length, the prompt and
        generated texts (16-byte references, heap collections of 4 KiB at least, about 8 bytes a new
        token and 256 a prompt), and the metadata of these five datasets."""
        from hookrun.store.overhead import dataset_bytes

        texts = 2 * 4096 + n_samples * (2 * 16 + 2 * 16 + self.generation.width * 8 + 256)  # (and a heap object's header)
        return n_samples * (self.generation.width * 8 + 24) + texts + dataset_bytes([(2, 1, False)] + [(1, 1, False)] * 4)

    def token_rows(self, call: ModelCall) -> int:
        """The padded prompt and every new token but the last (the last is never fed back)."""
        return as_kwargs(call)["input_ids"].shape[1] + self.generation.width - 1


def settings(cfg: HookrunConfig) -> dict[str, Any]:
    """cfg.generate without its nulls (null: generate's own default)."""
    return {k: v for k, v in (cfg.generate or {}).items() if v is not None}


def check_token_ids(kwargs: dict[str, Any], model: nn.Module, given: set[str]) -> None:
    """pad_token_id and eos_token_id (one id or a list) are token ids of the model's vocabulary: an EOS
    id past it never comes and generation runs on to max_new_tokens (a negative one is the way to ask
    for no EOS); a pad id outside it fails in the embedding ("index out of range in self")."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        return
    for name in ("pad_token_id", "eos_token_id"):
        value = kwargs.get(name)
        ids = value if isinstance(value, list | tuple) else [value] if value is not None else []
        low = 0 if name == "pad_token_id" else None  # (EOS: a negative id asks for none)
        bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, int) or i >= vocab
                    or (low is not None and i < low)), None)
        if bad is not None:
            origin = f"generate.{name}={value!r}" if name in given else f"the tokenizer's {name} {value!r}"
            raise ConfigError(f"{origin}: {bad!r} is not a token id of {type(model).__name__}, whose vocabulary is "
                              f"0..{vocab - 1}; give ids within it (null: the tokenizer's, else generate's own"
                              + ("; -1: no end-of-sequence token)" if name == "eos_token_id" else ")"))
