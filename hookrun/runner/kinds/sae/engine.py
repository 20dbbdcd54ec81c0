"""SAELens 6's SAETrainer as hookrun's SAE engine: its training SAE and trainer config from the block.

    block = SaeBlock(from_="outputs/h3_cache", capture="res/transformer.h.3/output", architecture="topk",
                     d_sae=512, k=16, rows=100_000, batch_rows=1024); block.check()
    rows = CacheRows(block.from_, block.capture, block.batch_rows, block.shuffle)
    train = Training(block, rows.d_in, "transformer.h.3", rows)
    sae = train.fit(); save_sae(sae, "saes/h3")     # figures per step: train.logs

Everything the block does not set is SAELens' default (its training-SAE config class for the
architecture, SAETrainerConfig's Adam betas, windows, the gradient clipping in its step). The SAE is
built right after `torch.manual_seed(block.seed)`, so a run equals SAETrainer given the same rows in
the same order. The per-step figures are SAELens' own `build_train_step_log_dict` of each step's
output (what it logs to wandb when asked), taken after the step as its fit loop does, and hookrun's
`silent_features` beside them (below: SAELens' `dead_features` stays 0 in a run shorter than its window).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from sae_lens import SAETrainer
from sae_lens.config import SAETrainerConfig
from sae_lens.registry import get_sae_training_class

from hookrun.analysis.stats import human_bytes
from hookrun.error_words import write_reason
from hookrun.errors import ConfigError, RunError
from hookrun.runner.kinds.sae.block import NORMALIZE, SaeBlock
from hookrun.store.whole_file import remove_leftovers

StepHook = Callable[[int, dict[str, Any]], None]
BLOWUP = 1e6  # a loss this many times the first step's: the training has diverged (an lr far too large), finite or not


def sae_config(block: SaeBlock, d_in: int, hook_name: str | Mapping | None = None, device: str = "cpu") -> Any:
    """SAELens' training-SAE config for the block's architecture: the block's keys, SAELens' defaults; `hook_name`:
    its metadata's hook_name, or a mapping of metadata keys (hook_name, model_name: written to cfg.json)."""
    cls, cfg_cls = get_sae_training_class(block.architecture)
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    keys = block.arch_keys()
    foreign = sorted(set(keys) - fields)
    if foreign:
        raise ConfigError(f"sae.{foreign[0]}: SAELens' {block.architecture} training SAE has no such key; drop it "
                          f"(its keys: {', '.join(sorted(fields - {'d_in', 'd_sae', 'dtype', 'device', 'metadata'}))})")
    if "k" in keys and block.architecture != "topk":
        keys["k"] = float(keys["k"])  # batchtopk's k is a float (a mean over the batch)
    cfg = cfg_cls(d_in=d_in, d_sae=block.d_sae, device=device, normalize_activations=NORMALIZE[block.normalize],
                  **keys)
    # k left out takes SAELens' default (100), which torch's topk refused at the first step where d_sae is smaller
    if "k" not in keys and getattr(cfg, "k", None) is not None and cfg.k > block.d_sae:
        raise ConfigError(f"sae.k: not given, so SAELens' default for {block.architecture}, k={cfg.k:g} latents kept "
                          f"per row, is more than d_sae {block.d_sae}; give sae.k from 1 to {block.d_sae}")
    for key, value in (hook_name if isinstance(hook_name, Mapping) else {"hook_name": hook_name}).items():
        cfg.metadata[key] = value
    return cfg


def build_sae(block: SaeBlock, d_in: int, hook_name: str | Mapping | None = None, device: str = "cpu") -> Any:
    """The training SAE, built right after torch.manual_seed(block.seed)."""
    cfg = sae_config(block, d_in, hook_name, device)
    cls, _ = get_sae_training_class(block.architecture)
    torch.manual_seed(block.seed)
    return cls(cfg)


def trainer_config(block: SaeBlock, checkpoint_path: str | None = None, device: str = "cpu") -> SAETrainerConfig:
    """SAETrainerConfig from the block: lr and its schedule, batch, budget, checkpoints, windows."""
    steps = block.rows // block.batch_rows
    sched = block.lr_schedule
    extra = {k: getattr(block, k) for k in ("dead_feature_window", "feature_sampling_window")
             if getattr(block, k) is not None}
    if block.norm_batches is not None:
        extra["n_batches_for_norm_estimate"] = block.norm_batches
    return SAETrainerConfig(total_training_samples=block.rows, train_batch_size_samples=block.batch_rows, lr=block.lr,
                            lr_end=sched["end"], lr_scheduler_name=sched.get("scheduler", "constant"),
                            lr_warm_up_steps=sched["warmup"],
                            lr_decay_steps=int(math.floor(sched["decay"] * steps)), device=device,
                            n_checkpoints=block.checkpoints, checkpoint_path=checkpoint_path, **extra)


class LoggingTrainer(SAETrainer):
    """SAETrainer that hands each step's log dict (SAELens' build_train_step_log_dict) to `on_step`."""

    def __init__(self, *args: Any, on_step: StepHook | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_step = on_step
        self.first_loss: float | None = None  # (this process's first step: a resumed run's, its first after the checkpoint)

    def save_checkpoint(self, checkpoint_name: str, *args: Any, **kwargs: Any) -> None:
        """SAELens' checkpoint; a write that fails (a full disk) is one RunError line, and the folder it cut
        short removed (a resume takes the checkpoint before it)."""
        try:
            super().save_checkpoint(checkpoint_name, *args, **kwargs)
        except Exception as exc:
            folder = Path(str(self.cfg.checkpoint_path)) / checkpoint_name
            shutil.rmtree(folder, ignore_errors=True)
            raise RunError(f"sae: writing the checkpoint {folder} failed ({write_reason(exc)}; is the disk full?); the "
                           "run's file keeps the steps before it: free some space and run again with resume=true") from exc

    def step(self, batch: torch.Tensor) -> Any:
        out = super().step(batch)
        if self.on_step is not None:
            figures = self.build_train_step_log_dict(out, self.n_training_samples)
            figures["sparsity/silent_features"] = silent_features(self, self.n_training_steps + 1)  # (counted after it)
            self.on_step(self.n_training_steps, figures)
        loss = float(out.loss.detach())
        first = self.first_loss = loss if self.first_loss is None else self.first_loss
        if not math.isfinite(loss) or first > 0 and loss > BLOWUP * first:  # (NaN weights: every later step's too;
            # a finite 6e26 from 234 at sae.lr=1000 trained on to the end and wrote an SAE of no use, `complete`)
            why = ("so the SAE's weights are no longer finite" if not math.isfinite(loss) else
                   f"more than {BLOWUP:g} times its first step's {first:g}, so the SAE reconstructs nothing")
            raise RunError(f"sae: the training diverged at step {self.n_training_steps}: its loss is {loss:g} (lr "
                           f"{self.cfg.lr:g}), {why}; no SAE is written: give a smaller sae.lr (or sae.normalize: "
                           "expected_norm, for rows of a large norm)")
        return out


def silent_features(trainer: SAETrainer, steps: int) -> int:
    """The latents that have not fired in the last min(dead_feature_window + 1, `steps`) of the `steps`
    training steps done: SAELens' `dead_features` (silent for more than dead_feature_window steps, 1000 by
    default) once the training is longer than its window, and before that the latents that never fired,
    which SAELens cannot yet count (a 320-step run that fired 14 of its 128 latents logged dead_features 0)."""
    return int((trainer.n_forward_passes_since_fired >= silence_window(trainer, steps)).sum())


def silence_window(trainer: SAETrainer, steps: int) -> int:
    """The last steps silent_features looks over: dead_feature_window + 1, or the `steps` done where fewer."""
    return min(int(trainer.cfg.dead_feature_window) + 1, max(int(steps), 1))


class Training:
    """One training: the SAE, the trainer over `rows`, and the figures of each step (`logs`)."""

    def __init__(self, block: SaeBlock, d_in: int, hook_name: str | Mapping | None, rows: Iterator[torch.Tensor],
                 checkpoint_path: str | None = None, device: str = "cpu", on_step: StepHook | None = None,
                 save_checkpoint_fn: Callable[..., None] | None = None) -> None:
        self.block = block
        self.logs: list[dict[str, Any]] = []
        hook = on_step or (lambda step, log: self.logs.append(log))
        self.memory = functools.partial(out_of_memory, d_in, block.d_sae, device)
        with self.memory("building"):
            self.sae = build_sae(block, d_in, hook_name, device)
            self.trainer = LoggingTrainer(trainer_config(block, checkpoint_path, device), self.sae, rows,
                                          on_step=hook, save_checkpoint_fn=save_checkpoint_fn)

    def resume(self, checkpoint: str | Path) -> int:
        """Carry on from a checkpoint folder SAELens wrote: weights, optimizer, schedules, windows.
        Returns the steps it holds (the batches already trained on)."""
        self.trainer.load_trainer_state(checkpoint)
        self.sae.load_weights_from_checkpoint(checkpoint)
        done = self.trainer.n_training_samples
        self.trainer.checkpoint_thresholds = [t for t in self.trainer.checkpoint_thresholds if t >= done]
        return self.trainer.n_training_steps

    def fit(self, progress: bool = True) -> Any:
        """SAELens' fit; progress=False: without its progress bars (hookrun's progress=false): the training's, and
        expected_norm's estimate's before it."""
        import sae_lens.training.activation_scaler as scaler_module
        import sae_lens.training.sae_trainer as trainer_module

        bars = [(module, module.tqdm) for module in (trainer_module, scaler_module)]
        if not progress:
            for module, bar in bars:
                module.tqdm = functools.partial(bar, disable=True)
        try:
            with self.memory("training"):
                return self.trainer.fit()
        finally:
            for module, bar in bars:
                module.tqdm = bar


@contextlib.contextmanager
def out_of_memory(d_in: int, d_sae: int, device: str, doing: str) -> Iterator[None]:
    """torch's out-of-memory errors (CUDA's OutOfMemoryError, the CPU allocator's "can't allocate memory")
    as one RunError line: the SAE's size, the bytes asked, and what its weights and Adam's state take."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        text = " ".join(str(exc).split())
        if not isinstance(exc, torch.OutOfMemoryError) and "can't allocate memory" not in text:
            raise
        asked = re.search(r"(?:tried to allocate|Tried to allocate) ([\d.]+ ?[KMGT]?i?B|\d+ bytes)", text)
        weights = (2 * d_in * d_sae + d_in + d_sae) * 4  # W_enc, W_dec, b_enc, b_dec in float32
        raise RunError(f"sae: out of memory on {device} {doing} the SAE d_in {d_in} x d_sae {d_sae} (asked for "
                       f"{asked.group(1) if asked else 'more than was free'}; its weights take {human_bytes(weights)}, with "
                       f"their gradients and Adam's two moments {human_bytes(4 * weights)}): give a smaller sae.d_sae or "
                       "sae.batch_rows, or a device with more memory") from None


def holds_sae(folder: str | Path) -> bool:
    """Whether `folder` already holds an SAE (an SAELens cfg.json or weights)."""
    f = Path(folder)
    return (f / "cfg.json").exists() or (f / "sae_weights.safetensors").exists()


def save_sae(sae: Any, out: str | Path) -> Path:
    """The folder SAELens' training runner writes at the end: save_inference_model (cfg.json +
    sae_weights.safetensors; batchtopk and matryoshka as jumprelu with their threshold), written beside
    `out` and moved in whole; a failed write (a full disk) is one RunError line."""
    out = Path(out)
    remove_leftovers(out.parent, folder_of=out.name)  # a killed writer's hidden folder, once stale
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # (a kill or a full disk leaves no cut-off SAE in `out`)
    try:
        sae.save_inference_model(str(tmp))
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "cfg.json"):  # cfg.json last: it says the folder holds an SAE
            f.replace(out / f.name)
    except Exception as exc:
        raise RunError(f"sae: writing the SAE to {out} failed ({write_reason(exc)}); the run's file keeps its training "
                       "curves, not the SAE: free some space and run again with resume=true") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def inference_cfg(out: str | Path) -> dict[str, Any]:
    return json.loads((Path(out) / "cfg.json").read_text())
