"""Which options may go together, and the range of each number: checked before anything is built.

    check_config(load(cfg))   # ConfigError, one line, at the first option that does not fit

The table below is the whole list of combinations refused whatever else the config says; a run
kind's own refusals (a model without generate(), an ablation with nothing to ablate) are in its
module (hookrun.runner.kinds), where the built model and hooks are known.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, one_of

ABLATIONS = ("zero", "mean")  # evaluate.ablation: null, or one of these


def evaluating(cfg: HookrunConfig) -> bool:
    """evaluate is on: `enabled: true`, or `enabled: null` (the default) with an ablation or a mean named
    (`python -m hookrun evaluate.ablation=zero` evaluates; a Python `evaluate: {}` block is made
    `enabled: true` when it is loaded, hookrun.config.schema.load)."""
    ev = cfg.evaluate
    if ev is None or ev.enabled is False:
        return False
    return ev.enabled is True or ev.ablation is not None or ev.mean is not None


class Refused(NamedTuple):
    option: str  # the option this row is about
    when: Callable[[HookrunConfig], bool]  # true: the config has the refused combination
    message: str  # the one line: what is wrong, and what would be right


# option           | refused when                                          | the line
TOGETHER: list[Refused] = [
    Refused("patching", lambda c: getattr(c, "patching", None) is not None and c.mode is not Mode.eval,
            "patching with mode={mode}: a patching run makes its own forwards (clean, corrupted, patched; atp its "
            "own backward); drop mode or set mode=eval"),
    Refused("patching", lambda c: getattr(c, "patching", None) is not None and evaluating(c),
            "patching and evaluate are each a kind of run of their own and cannot go together; keep one of them"),
    Refused("mode=grad", lambda c: c.mode is Mode.grad and c.loss is None,
            "mode=grad needs a loss: add loss=cross_entropy, loss=lm (a language model's next-token loss), "
            "loss=sum, loss=target_logit or loss=custom"),
    Refused("evaluate", lambda c: evaluating(c) and c.mode is not Mode.eval,
            "evaluate needs mode=eval (its forwards run under no_grad), got mode={mode}; drop evaluate or set mode=eval"),
    Refused("evaluate", lambda c: evaluating(c) and c.early_stop,
            "evaluate with early_stop=true: the clean forward needs the whole model (its output); "
            "drop early_stop or evaluate"),
    Refused("evaluate", lambda c: evaluating(c) and c.loss is None,
            "evaluate has no loss for ce: add loss=lm (a language model's next-token cross-entropy), "
            "loss=cross_entropy (a classifier) or loss=custom"),
    Refused("evaluate.ablation", lambda c: evaluating(c) and c.evaluate.ablation not in (None, *ABLATIONS),
            "evaluate.ablation={ablation!r}; choose " + one_of(ABLATIONS) + " or null (no ablated forward)"),
    Refused("evaluate.mean", lambda c: evaluating(c) and c.evaluate.mean is not None and c.evaluate.ablation != "mean",
            "evaluate.mean={mean!r} is read by evaluate.ablation=mean only (ablation is {ablation}); "
            "set evaluate.ablation=mean or drop evaluate.mean"),
    Refused("evaluate.ablation", lambda c: evaluating(c) and c.evaluate.ablation == "mean" and not c.evaluate.mean,
            "evaluate.ablation=mean without a mean to use: set evaluate.mean=RUN.h5, an earlier hookrun run that "
            "recorded each modified module's output (rows: token gives the per-token mean)"),
    Refused("early_stop", lambda c: c.early_stop and c.mode is Mode.generate,
            "early_stop=true does not fit mode=generate: every model call's output makes the next token"),
    Refused("early_stop", lambda c: c.early_stop and c.mode is Mode.grad,
            "early_stop=true needs mode=eval: a backward pass needs the whole forward"),
    Refused("mode=generate", lambda c: c.mode is Mode.generate and c.loss is not None,
            "mode=generate runs no backward pass, so loss is unused: remove the loss, or use mode=grad"),
]


# key                | first allowed, last allowed (None: no bound) | what the number is
RANGES: list[tuple[str, int | None, int | None, str]] = [
    ("data.limit", 1, None, "data.limit must be at least 1 (or null for all batches), got {value}"),
    ("output.flush_every", 1, None, "output.flush_every must be at least 1 (or null: every 2 seconds), got {value}"),
    ("data.batch_size", None, sys.maxsize,
     "data.batch_size must be at least 1 and at most " + str(sys.maxsize) + ", got {value}"),
    ("seed", -(2**63), 2**64 - 1, "seed: {value} is out of range; use a whole number from 0 to " + str(2**64 - 1)
     + " (2**64 - 1)"),
]


def check_config(cfg: HookrunConfig) -> None:
    """Every row of TOGETHER, then every range, in order: the first that fails is one ConfigError."""
    ev = cfg.evaluate
    fields = {"mode": cfg.mode.value, "ablation": getattr(ev, "ablation", None), "mean": getattr(ev, "mean", None)}
    for row in TOGETHER:
        if row.when(cfg):
            raise ConfigError(row.message.format(**fields))
    for key, low, high, message in RANGES:
        value = lookup(cfg, key)
        if value is not None and ((low is not None and value < low) or (high is not None and value > high)):
            raise ConfigError(message.format(value=value))


def lookup(cfg: HookrunConfig, key: str) -> object:
    node: object = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node
