"""The `sae:` block: its keys, types and defaults, and the checks that need no model.

    block = SaeBlock(from_="outputs/h3_cache", capture="res/transformer.h.3/output", d_sae=512, rows=100_000)
    block.check()      # one ConfigError line per bad value; normalises shuffle and lr_schedule

`rows` is either the training budget (a number of activation rows: SAELens' total_training_samples)
or the row layout, as the issue's block writes it: `rows: token` (the capture's rows, a token's or a
sample's vector each: the default) or `rows: channel` (a feature map's channel vector at each
position). Where `rows` names the layout, the budget is `budget:` (required: no pass over the data
is implied); `budget:` may also stand beside a numeric `rows` only if they agree. `vectors: auto |
channel` is the older spelling of the layout (auto = token), kept as a synonym. After check(),
`rows` is the budget and `vectors` the layout ("auto" or "channel"), as the engine and readers take them.

The architecture keys (k, l1_coefficient, ...) are None unless given: None is SAELens' own default
for that architecture's training config. Whether a given key belongs to the chosen architecture is
checked against SAELens' config class itself (engine.sae_config), before any step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hookrun.errors import ConfigError, close_matches
from hookrun.runner.kinds.sae.evaluation import parse as parse_evaluate
from hookrun.store.paths import scheme_of

UNITS = ("training steps", "logged steps")  # what the log, inspect and the report call the run's steps and rows (a row of figures a step)

ARCHITECTURES = ("standard", "topk", "batchtopk", "jumprelu", "matryoshka_batchtopk")
NORMALIZE = {"none": "none", "expected_norm": "expected_average_only_in"}  # the block's word -> SAELens'
# the block keys passed to SAELens' training-SAE config when given (None: SAELens' default)
ARCH_KEYS = ("k", "l1_coefficient", "lp_norm", "l1_warm_up_steps", "l0_coefficient", "l0_warm_up_steps",
             "jumprelu_init_threshold", "jumprelu_bandwidth", "jumprelu_sparsity_loss_mode", "pre_act_loss_coefficient",
             "target_l0", "matryoshka_widths", "use_matryoshka_aux_loss", "aux_loss_coefficient",
             "rescale_acts_by_decoder_norm", "topk_threshold_lr", "decoder_init_norm", "apply_b_dec_to_input")
COEFFICIENTS = ("l1_coefficient", "l0_coefficient", "pre_act_loss_coefficient", "aux_loss_coefficient")  # >= 0
POSITIVE = {"jumprelu_bandwidth": "the width of the threshold's straight-through gradient (below 0 it points the "
            "wrong way)", "jumprelu_init_threshold": "the threshold a latent must pass (below 0 negative "
            "pre-activations pass)", "lp_norm": "the sparsity penalty's p (0 counts nonzero latents: no gradient)",
            "decoder_init_norm": "the decoder rows' starting norm (null: SAELens' own init)"}  # > 0 (threshold: >= 0)


@dataclass
class SaeBlock:
    """`sae:` (docs/sae.md): train a sparse dictionary with SAELens' SAETrainer on a cache's rows."""

    from_: str | None = None  # a cache run: its folder, its captures.h5, or an s3:// URL
    at: str | None = None  # or on the fly, no cache: a module of the run's own model, over the run's own data
    capture: str | None = None  # the capture whose rows are trained on (hook/module/role)
    vectors: str | None = None  # the layout's older spelling: auto (= rows: token) or channel
    architecture: str = "topk"
    d_sae: int = 2048
    lr: float = 3e-4
    lr_schedule: Any = None  # {warmup: steps, decay: fraction of the steps, scheduler: constant | cosineannealing, end}
    batch_rows: int = 4096
    rows: Any = 0  # the training budget in activation rows (SAELens' total_training_samples), or the layout: token | channel
    budget: int | None = None  # the budget where `rows` names the layout
    shuffle: Any = None  # {buffer_rows, seed} (default 1_000_000 rows, seed 0); false: the cache's order
    normalize: str = "none"
    norm_batches: int | None = None  # expected_norm's estimate batches (SAELens' default: 1000)
    checkpoints: int = 0
    seed: int = 0  # torch.manual_seed just before the SAE is built
    out: str | None = None  # the SAE folder; default the run folder's sae/
    overwrite: bool = False
    evaluate: Any = None  # {data: {...}, limit: N}: after training, the splice evaluated on held-out items (evaluation.py)
    dead_feature_window: int | None = None
    feature_sampling_window: int | None = None
    k: Any = None
    l1_coefficient: float | None = None
    lp_norm: float | None = None
    l1_warm_up_steps: int | None = None
    l0_coefficient: float | None = None
    l0_warm_up_steps: int | None = None
    jumprelu_init_threshold: float | None = None
    jumprelu_bandwidth: float | None = None
    jumprelu_sparsity_loss_mode: str | None = None
    pre_act_loss_coefficient: float | None = None
    target_l0: float | None = None
    matryoshka_widths: Any = None
    use_matryoshka_aux_loss: bool | None = None
    aux_loss_coefficient: float | None = None
    rescale_acts_by_decoder_norm: bool | None = None
    topk_threshold_lr: float | None = None
    decoder_init_norm: float | None = None
    apply_b_dec_to_input: bool | None = None

    def check(self) -> None:
        """One ConfigError line per bad value; shuffle and lr_schedule become plain dicts (or False)."""
        if bool(self.from_) == bool(self.at) or (self.from_ and not self.capture):
            what = ("both `from` and `at` are given" if self.from_ and self.at else "`from` has no `capture`"
                    if self.from_ else "neither `from` nor `at` is given")
            raise ConfigError(f"sae: {what}; give `from` (a cache run: folder, captures.h5 or s3:// URL) and `capture` "
                              "(its hook/module/role, e.g. res/transformer.h.3/output), or `at` (a module of the "
                              "run's own model, trained on the fly), not both")
        if self.architecture not in ARCHITECTURES:
            near = close_matches(self.architecture, ARCHITECTURES)
            raise ConfigError(f"sae.architecture: {self.architecture!r} is not one of SAELens' training SAEs hookrun "
                              f"trains ({', '.join(ARCHITECTURES)})" + (f"; did you mean {near[0]!r}?" if near else ""))
        self.rows, self.vectors = _rows(self.rows, self.budget, self.vectors)
        if self.normalize not in NORMALIZE:
            raise ConfigError(f"sae.normalize: {self.normalize!r}; choose none or expected_norm")
        for key in ("d_sae", "batch_rows"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"sae.{key}: must be at least 1, got {getattr(self, key)}")
        if self.rows < self.batch_rows:
            raise ConfigError(f"sae.rows: the training budget ({self.rows} rows) is smaller than one batch "
                              f"(sae.batch_rows {self.batch_rows}); give rows >= batch_rows")
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"sae.lr: must be a finite number above 0, got {self.lr}")
        if self.checkpoints < 0:
            raise ConfigError(f"sae.checkpoints: must be 0 or more, got {self.checkpoints}")
        if self.out and scheme_of(self.out).remote:  # (Path() would make a local folder named 's3:')
            raise ConfigError(f"sae.out: {self.out!r} is a URL; the SAE folder is written to local disk only: give a "
                              "local folder (e.g. sae.out=saes/h3) and copy it up after the run")
        for key, value in self.arch_keys().items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"sae.{key}: {value} is not a finite number; give a finite one")
            if key in POSITIVE and (value < 0 or value == 0 and key != "jumprelu_init_threshold"):
                raise ConfigError(f"sae.{key}: {value}; it is {POSITIVE[key]}: give "
                                  + ("0 or more" if key == "jumprelu_init_threshold" else "a number above 0"))
        for key in COEFFICIENTS:
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise ConfigError(f"sae.{key}: {getattr(self, key)} is negative, which rewards what the loss term "
                                  "penalises; give 0 or more")
        if self.k is not None:
            if self.architecture not in ("topk", "batchtopk", "matryoshka_batchtopk"):
                raise ConfigError(f"sae.k: the {self.architecture} SAE has no k (topk, batchtopk and "
                                  "matryoshka_batchtopk do); drop it (sae.k=null, where the experiment sets one)")
            if isinstance(self.k, bool) or not isinstance(self.k, int | float):
                raise ConfigError(f"sae.k: expected a number of latents kept per row, got {self.k!r}")
            if self.architecture == "topk" and not float(self.k).is_integer():
                raise ConfigError(f"sae.k: the topk SAE keeps a whole number of latents per row, got {self.k}; give "
                                  f"an integer (batchtopk keeps k per row on average, a fraction allowed)")
            if self.architecture == "topk":
                self.k = int(self.k)
            if not 0 < self.k <= self.d_sae:
                raise ConfigError(f"sae.k: {self.k} latents kept of d_sae {self.d_sae}; give 1 <= k <= d_sae")
        if self.architecture == "matryoshka_batchtopk" and self.matryoshka_widths is None:
            raise ConfigError(f"sae.matryoshka_widths: the matryoshka_batchtopk SAE needs its nested widths, rising to "
                              f"d_sae (e.g. [{max(1, self.d_sae // 4)}, {self.d_sae}])")
        if self.matryoshka_widths is not None:
            widths = [_number(w, "matryoshka_widths", "whole numbers of latents, e.g. [16, 64]")
                      for w in (self.matryoshka_widths if isinstance(self.matryoshka_widths, list | tuple) else [None])]
            if not widths or widths[0] < 1 or any(a >= b for a, b in zip(widths, widths[1:], strict=False)) or widths[-1] != self.d_sae:
                raise ConfigError(f"sae.matryoshka_widths: {widths} must rise strictly from at least 1 and end at d_sae "
                                  f"({self.d_sae}), e.g. [{max(1, self.d_sae // 4)}, {self.d_sae}]")
            self.matryoshka_widths = widths
        if self.norm_batches is not None and (isinstance(self.norm_batches, bool) or int(self.norm_batches) < 1):
            raise ConfigError(f"sae.norm_batches: expected_norm's estimate needs at least 1 batch, got {self.norm_batches}")
        if self.jumprelu_sparsity_loss_mode is not None:
            modes = _literal("jumprelu_sparsity_loss_mode")
            if modes and self.jumprelu_sparsity_loss_mode not in modes:
                raise ConfigError(f"sae.jumprelu_sparsity_loss_mode: {self.jumprelu_sparsity_loss_mode!r}; choose "
                                  f"{', '.join(modes)} (SAELens' modes)")
        self.shuffle = _shuffle(self.shuffle)
        self.lr_schedule = _schedule(self.lr_schedule, self.lr, self.rows // self.batch_rows)
        _window(self, "dead_feature_window")
        _window(self, "feature_sampling_window")
        self.evaluate = parse_evaluate(self.evaluate)
        if self.evaluate and self.vectors == "channel":
            raise ConfigError("sae.evaluate: the evaluation measures an SAE on token rows, not on a feature map's "
                              "channel vectors (rows: channel); drop sae.evaluate (op: splice splices the trained SAE "
                              "at each position's channels in a run of its own)")

    def arch_keys(self) -> dict[str, Any]:
        """The architecture keys the block gives (the rest stay SAELens' defaults)."""
        return {k: getattr(self, k) for k in ARCH_KEYS if getattr(self, k) is not None}


def _literal(key: str) -> tuple:
    """The values SAELens' JumpReLU training config allows for `key` (its Literal type), as installed."""
    import typing

    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAEConfig

    return typing.get_args(typing.get_type_hints(JumpReLUTrainingSAEConfig).get(key))


def _shuffle(value: Any) -> dict[str, int] | bool:
    if value is False:
        return False
    if value is True:  # (on, with the defaults: what leaving it out means)
        value = None
    if value is not None and not isinstance(value, Mapping) or set(value or {}) - {"buffer_rows", "seed"}:
        raise ConfigError(f"sae.shuffle: {value!r}; give {{buffer_rows: N, seed: S}}, true or false (the cache's own order)")
    got = dict(value or {})
    out = {"buffer_rows": _number(got.get("buffer_rows", 1_000_000), "shuffle.buffer_rows", "a whole number of rows"),
           "seed": _number(got.get("seed", 0), "shuffle.seed", "a whole number (the shuffle's seed), e.g. 0")}
    if out["buffer_rows"] < 1 or out["seed"] < 0:
        bad = ("buffer_rows", "must be at least 1") if out["buffer_rows"] < 1 else ("seed", "must be 0 or more (numpy's seed)")
        raise ConfigError(f"sae.shuffle.{bad[0]}: {bad[1]}, got {out[bad[0]]}")
    return out


SCHEDULERS = ("constant", "cosineannealing")  # SAELens' lr_scheduler_name values the block passes through


def _schedule(value: Any, lr: float, steps: int) -> dict[str, Any]:
    """{warmup, decay, end, scheduler} as SAELens' get_lr_scheduler takes them, refused in one line
    where SAELens would ignore a key (end on the constant schedule) or misbehave (a warmup past the
    run's steps never reaches lr; a cosine with no step left between warmup and decay divides by 0)."""
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"sae.lr_schedule: {value!r}; give {{warmup: steps, decay: fraction, scheduler, end}} or null")
    got = dict(value or {})
    unknown = set(got) - {"warmup", "decay", "end", "scheduler"}
    if unknown:
        raise ConfigError(f"sae.lr_schedule: unknown key(s) {', '.join(sorted(unknown))}; its keys are warmup "
                          "(steps), decay (the last fraction of the steps, falling linearly to 0), scheduler "
                          "(constant | cosineannealing) and end (the lr the cosine falls to; lr / 10)")
    out = {"warmup": _number(got.get("warmup", 0), "lr_schedule.warmup", "a whole number of steps"),
           "decay": _number(got.get("decay", 0.0), "lr_schedule.decay", "a fraction of the steps in [0, 1)", whole=False),
           "scheduler": str(got.get("scheduler") or "constant"),
           "end": _number(got["end"], "lr_schedule.end", "an lr in [0, lr]", whole=False) if got.get("end") is not None
           else lr / 10}
    if out["warmup"] < 0 or not 0.0 <= out["decay"] < 1.0:
        raise ConfigError(f"sae.lr_schedule: warmup {out['warmup']} must be >= 0 and decay {out['decay']} "
                          "a fraction in [0, 1)")
    if out["scheduler"] not in SCHEDULERS:
        raise ConfigError(f"sae.lr_schedule.scheduler: {out['scheduler']!r}; choose constant (lr held) or "
                          "cosineannealing (lr falls along a cosine to end), SAELens' lr_scheduler_name")
    if got.get("end") is not None and out["scheduler"] == "constant":
        raise ConfigError(f"sae.lr_schedule.end: SAELens' constant schedule has no end lr (lr is held, and the decay "
                          f"falls linearly to 0 whatever lr_end says); drop end, or give "
                          f"sae.lr_schedule.scheduler=cosineannealing (lr falls along a cosine to end {out['end']:g})")
    decay = int(math.floor(out["decay"] * steps))
    if not 0.0 <= out["end"] <= lr or (decay and out["end"] == 0.0 and out["scheduler"] != "constant"):
        raise ConfigError(f"sae.lr_schedule.end: {out['end']:g} must lie in [0, lr {lr:g}]"
                          + (", and above 0 with decay (SAELens' decay falls from end to 0)" if decay else ""))
    if out["warmup"] > steps:
        raise ConfigError(f"sae.lr_schedule.warmup: {out['warmup']} warmup steps is longer than the {steps} steps "
                          f"SAELens' schedule spans (rows // batch_rows; a last, smaller batch is one step more): "
                          f"the run would end still warming up; give warmup <= {steps}")
    cosine = out["scheduler"] != "constant"  # (constant: a decay that starts before the warmup's last step cuts it short)
    if out["warmup"] + decay >= steps + (0 if cosine else 2):
        raise ConfigError(f"sae.lr_schedule: warmup {out['warmup']} + decay {decay} steps " + (f"leave no step of the {steps} SAELens' schedule spans for the cosine; give warmup + decay x steps < {steps}" if cosine else
                          f"overlap in the {steps} steps SAELens' schedule spans: its decay from step {steps - decay} cuts "
                          f"the warmup short, the lr jumping to lr; give warmup + decay x steps <= {steps + 1}"))
    return out


def _number(value: Any, key: str, what: str, whole: bool = True) -> Any:
    """`value` as an int (whole) or a float, or one ConfigError line naming sae.KEY and what to give."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        number = float(value) if not isinstance(value, bool) and isinstance(value, int | float | str) else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or (whole and not number.is_integer()):
        raise ConfigError(f"sae.{key}: {value!r} is not {'a whole number' if whole else 'a number'}; give {what}")
    return int(number) if whole else number


def _window(block: Any, key: str) -> None:
    """SAELens counts a latent dead after more than dead_feature_window steps silent, and takes the
    firing rates every feature_sampling_window steps: below 1, most latents read dead, or it divides by 0."""
    value = getattr(block, key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        what = ("SAELens counts a latent dead once it has been silent for more than this many steps, so "
                f"{value} counts every latent silent in the latest batch as dead (the dead_features figure and the "
                "auxiliary loss)" if key == "dead_feature_window" else
                "SAELens takes the firing rates every this many steps (a window of 0 divides by zero)")
        raise ConfigError(f"sae.{key}: {value!r}; {what}; give a whole number of steps >= 1 (SAELens' default: "
                          f"{1000 if key == 'dead_feature_window' else 2000})")


LAYOUTS = {"token": "auto", "channel": "channel"}  # rows: LAYOUT -> the layout as data.py / live.py take it


def _rows(rows: Any, budget: Any, vectors: str | None) -> tuple[int, str]:
    """(the budget in rows, the layout "auto" | "channel") from `rows`, `budget` and `vectors`."""
    if vectors is not None and vectors not in ("auto", "channel"):
        raise ConfigError(f"sae.vectors: {vectors!r}; choose auto (the capture's rows) or channel (a feature "
                          "map's channel vector at each position); sae.rows: token | channel says the same")
    layout = vectors
    if isinstance(rows, str):
        if rows not in LAYOUTS:
            near = close_matches(rows, list(LAYOUTS))
            raise ConfigError(f"sae.rows: {rows!r}; give the training budget in rows (a number, e.g. 1_000_000) or "
                              "the row layout: token (the capture's rows) or channel (a feature map's channel vector "
                              "at each position)" + (f"; did you mean {near[0]!r}?" if near else ""))
        if vectors is not None and LAYOUTS[rows] != vectors:
            raise ConfigError(f"sae.rows: {rows} and sae.vectors: {vectors} disagree; drop vectors (rows: token | "
                              "channel is the layout)")
        if budget is None:
            raise ConfigError(f"sae.budget: rows: {rows} names the row layout, so the training budget in rows is "
                              "sae.budget; give it (e.g. budget: 1_000_000)")
        rows, layout = budget, LAYOUTS[rows]
    elif budget is not None:
        if rows and rows != budget:
            raise ConfigError(f"sae.budget: {budget} and sae.rows: {rows} are both a budget; give one (rows: token | "
                              "channel with budget:, or rows: N)")
        rows = budget
    if isinstance(rows, bool) or not isinstance(rows, int | float) or int(rows) != rows:
        raise ConfigError(f"sae.{'budget' if budget is not None else 'rows'}: {rows!r}; the training budget is a whole "
                          "number of rows")
    return int(rows), layout or "auto"
