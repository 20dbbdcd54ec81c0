"""evaluate's block: its keys (EvaluateBlock), when it is on, and the combinations it refuses whatever
the model (one line each).

    evaluating(cfg)     # True: `enabled: true`, or `enabled: null` with an ablation or a mean
    check_block(cfg)    # ConfigError at the first row of REFUSED that the config has

EvaluateKind.check runs these before anything is built; the refusals that need the built model and
hooks (an ablation with no modify action) are in EvaluateKind's constructor (kind.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hookrun.config import Refused
from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, one_of

ABLATIONS = ("zero", "mean")  # evaluate.ablation: null, or one of these


@dataclass
class EvaluateBlock:
    """evaluate: the clean, intervened (and ablated) forward of every batch, and their metrics. A block
    given is on (`evaluate: {}` in Python, `evaluate.ablation=zero` on the command line: `enabled`
    left out is true); `enabled: null` leaves it to `ablation` and `mean` (on where either is set);
    `enabled: false` or `evaluate: null` is off. `evaluating` says which."""

    enabled: bool | None = True
    ablation: str | None = None  # null | zero | mean: a third forward with each modify action's result replaced
    mean: str | None = None  # ablation=mean: an earlier hookrun run (.h5) that recorded each modified module's tensor


def evaluating(cfg: HookrunConfig) -> bool:
    """evaluate is on: its block given with `enabled: true` (the block's default: `python -m hookrun
    evaluate.ablation=zero` and a Python `evaluate: {}` evaluate), or `enabled: null` with an ablation
    or a mean named."""
    ev = cfg.evaluate
    if ev is None or ev.enabled is False:
        return False
    return ev.enabled is True or ev.ablation is not None or ev.mean is not None


# option           | refused when (evaluate is on)                         | the line
REFUSED: list[Refused] = [
    Refused("evaluate", lambda c: c.mode is not Mode.eval,
            "evaluate needs mode=eval (its forwards run under no_grad), got mode={mode}; drop evaluate or set mode=eval"),
    Refused("evaluate", lambda c: c.early_stop,
            "evaluate with early_stop=true: the clean forward needs the whole model (its output); "
            "drop early_stop or evaluate"),
    Refused("evaluate", lambda c: c.loss is None,
            "evaluate has no loss for ce: add loss=lm (a language model's next-token cross-entropy), "
            "loss=cross_entropy (a classifier) or loss=custom"),
    Refused("evaluate.ablation", lambda c: c.evaluate.ablation not in (None, *ABLATIONS),
            "evaluate.ablation={ablation!r}; choose " + one_of(ABLATIONS) + " or null (no ablated forward)"),
    Refused("evaluate.mean", lambda c: c.evaluate.mean is not None and c.evaluate.ablation != "mean",
            "evaluate.mean={mean!r} is read by evaluate.ablation=mean only (ablation is {ablation}); "
            "set evaluate.ablation=mean or drop evaluate.mean"),
    Refused("evaluate.ablation", lambda c: c.evaluate.ablation == "mean" and not c.evaluate.mean,
            "evaluate.ablation=mean without a mean to use: set evaluate.mean=RUN.h5, an earlier hookrun run that "
            "recorded each modified module's output (rows: token gives the per-token mean)"),
]


def check_block(cfg: HookrunConfig) -> None:
    """The first row of REFUSED that an evaluating config has: one ConfigError line."""
    ev = cfg.evaluate
    fields = {"mode": cfg.mode.value, "ablation": ev.ablation, "mean": ev.mean}
    for row in REFUSED:
        if row.when(cfg):
            raise ConfigError(row.message.format(**fields))
