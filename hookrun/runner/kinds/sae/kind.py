"""The sae run kind: SAELens' SAETrainer on a cache run's rows (or, with `at:`, a module's output on
the fly); a step is one training step; one process only (many ranks are refused).

    python -m hookrun experiment=sae_train hydra.run.dir=outputs/h3_sae     # the `sae:` block
    hookrun.open_run("outputs/h3_sae").sae_curves()                        # the figures per step

Each training step writes one row: /samples/index holds the step number and the captures
`sae/curves/NAME` SAELens' figures of that step (its build_train_step_log_dict: the loss and its
terms, mse_loss, l0, explained_variance, dead_features, lr after the step, samples seen), through
the store's normal path (flushes, crash safety). Checkpoints are SAELens' own folders
(`checkpoints/<samples seen>/` beside the file; STEM.checkpoints/ beside a file not named
captures.h5). A resumed run (resume=true) loads the last whole checkpoint at or before the steps
the file kept, skips the rows those steps read, trains on and writes only the steps the file lacks:
the steps in between are trained again, in the same order, to the same figures. The trained SAE is
written at the end with SAELens' save_inference_model to `sae.out` (default: sae/ beside the file,
STEM.sae/ likewise). A cache's batches are read ahead by a thread (prefetch.py; with device: cuda,
through pinned memory onto the GPU while the step runs). The root attribute `sae` (JSON) holds the
block as run, the capture's module, d_in, the cache's rows and identity (resuming.py: a resume refuses
another cache, and another run's SAE in `out`) and the epochs the budget takes; `sae_evaluation` (JSON)
sae.evaluate's totals (evaluation.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError, HookrunError
from hookrun.output.process import detect, every_rank
from hookrun.runner.kinds import RunKind
from hookrun.runner.kinds.sae.block import UNITS, SaeBlock
from hookrun.runner.kinds.sae.data import CacheRows, check_spliced_at_output, sae_meta, spliced_arg
from hookrun.runner.kinds.sae.resuming import (
    SWEEP_MARK,
    check_sweep_out,
    checkpoints_before,
    clear_checkpoints,
    mark_sweep_out,
    multirun_job_folder,
)
from hookrun.store.paths import local_path, scheme_of
from hookrun.store.records import Capture, CaptureKey, StepRecord

log = logging.getLogger("hookrun")
RENAME = {"details/current_learning_rate": "lr", "details/n_training_samples": "samples"}


def figure_name(key: str, taken: set[str]) -> str:
    """SAELens' log key -> the capture's role: its last part ('losses/mse_loss' -> 'mse_loss')."""
    name = RENAME.get(key, key.rsplit("/", 1)[-1])
    return key.replace("/", ".") if name in taken else name


class SaeKind(RunKind):
    forwards = 0  # no model forward: the rows come from the cache
    adds = ("captures/sae",)
    units, estimated = UNITS, False  # (the steps' figures are not in the dry-run estimate)

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        """The cache, its capture, the architecture's keys and the out folder, before anything is built."""
        import importlib.util

        if (r := detect()).many:  # (every rank would run SAELens' whole fit: one SAE written twice, each step twice)
            raise every_rank(ConfigError(
                f"sae with {r.world} processes ({r.launcher}): SAELens' trainer runs in one process, so every rank "
                f"would train the whole SAE again into the same sae.out; run it in one process (python -m hookrun)"))
        if importlib.util.find_spec("sae_lens") is None:
            raise ConfigError("sae: training runs SAELens 6's trainer, which is not installed: pip install sae-lens "
                              "(it pins TransformerLens 3.9: keep it out of an environment that needs TransformerLens 4)")
        from hookrun.runner.kinds.sae.engine import holds_sae, sae_config
        from hookrun.runner.kinds.sae.evaluation import check_items, check_model
        from hookrun.runner.kinds.sae.resuming import (
            cache_identity,
            check_cache,
            check_out,
            old_sae,
        )

        block: SaeBlock = cfg.sae
        old = old_sae(cfg) if cfg.resume else None  # (a complete one: the runner does nothing, its SAE stays)
        if block.evaluate:
            check_items(cfg, block.evaluate)
        if block.from_:  # on the fly (`at`), the keys are checked once the model gives d_in (__init__)
            rows = CacheRows(block.from_, block.capture, block.batch_rows, block.shuffle, block.vectors)
            try:
                sae_config(block, rows.d_in, rows.info.module)
                if old is not None and old["status"] != "complete":
                    check_cache(old, cache_identity(rows), block.from_)
                if block.evaluate:
                    check_spliced_at_output(rows.info, block.capture)
                    check_model(cfg, rows.run.config, block.from_)
            finally:
                rows.close()
        out = out_folder(cfg)
        if holds_sae(out) and not block.overwrite:
            check_out(out, old, cfg.resume)
        elif holds_sae(out):  # (another job of this sweep's SAE: not replaced)
            check_sweep_out(out)

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.block: SaeBlock = ctx.cfg.sae
        b = self.block
        if b.at:
            from hookrun.runner.kinds.sae.engine import sae_config
            from hookrun.runner.kinds.sae.live import LiveRows

            # (a buffer past the rows training draws ran the model over the data again and again before step 1)
            shuffle = b.shuffle and {**b.shuffle, "buffer_rows": min(b.shuffle["buffer_rows"], b.rows + self.norm_rows())}
            self.rows: Any = LiveRows(ctx.model, ctx.loader, ctx.spec, b.at, b.batch_rows, shuffle, b.vectors, ctx.device,
                                      limit=ctx.cfg.data.limit)
            self.module, self.cache_rows = b.at, None
            sae_config(b, self.rows.d_in, b.at)
        else:
            self.rows = CacheRows(b.from_, b.capture, b.batch_rows, b.shuffle, b.vectors)
            self.module, self.cache_rows = self.rows.info.module, self.rows.n_rows
            if b.evaluate:
                from hookrun.runner.kinds.sae.evaluation import check_weights

                try:
                    check_weights(ctx.cfg, ctx.model, self.rows.run, b.from_)
                except ConfigError:
                    self.rows.close()
                    raise
        self.out = out_folder(ctx.cfg)
        local = not scheme_of(ctx.cfg.output.path).remote
        self.checkpoints = run_folder(ctx.cfg, "checkpoints") if local else self.out.with_name(self.out.name + ".checkpoints")
        self.epochs = self.rows.epochs_for(self.block.rows + self.norm_rows()) if self.cache_rows else None
        self.evaluation: dict[str, Any] | None = None
        if b.evaluate and self.module not in dict(ctx.model.named_modules()):
            raise ConfigError(f"sae.evaluate: the run's model has no module {self.module!r} to splice the SAE into "
                              "(the cache's capture was recorded there); give the cache's model, or drop sae.evaluate")

    def norm_rows(self) -> int:
        """Rows expected_norm's estimate reads before training (SAELens' n_batches_for_norm_estimate)."""
        if self.block.normalize != "expected_norm":
            return 0
        return (self.block.norm_batches if self.block.norm_batches is not None else 1000) * self.block.batch_rows

    def prepare_run(self, p: Any) -> None:
        b = self.block
        given = {f.name.rstrip("_"): getattr(b, f.name) for f in dataclasses.fields(b) if getattr(b, f.name) is not None}
        attrs = {**given, "module": self.module, "d_in": self.rows.d_in, "cache_rows": self.cache_rows,
                 "epochs": self.epochs, "out": str(self.out), "steps": -(-b.rows // b.batch_rows)}
        if self.cache_rows:
            from hookrun.runner.kinds.sae.resuming import cache_identity

            attrs["cache"] = cache_identity(self.rows)
        p.attrs["sae"] = json.dumps(attrs)
        if self.cache_rows:
            log.info("sae: %s rows of %s's %s (%d a pass): %d epoch(s)%s", b.rows, b.from_, b.capture,
                     self.cache_rows, self.epochs, " in a new seeded order each" if b.shuffle and self.epochs > 1 else "")
        else:
            log.info("sae: %s rows of %s's output on the fly (the run's model over its data)", b.rows, b.at)

    def run_steps(self, data_loop: Any, writer: Any, first_row: int, should_stop: Any) -> int:
        """SAELens' fit over the cache's rows; each step's figures a row, those from `first_row` on."""
        from hookrun.runner.kinds.sae.engine import (
            Training,
            save_sae,
            silence_window,
            silent_features,
        )

        written = [0]
        names: dict[str, str] = {}

        def on_step(step: int, figures: dict[str, Any]) -> None:
            if step >= first_row:
                if not names:
                    for key in figures:
                        names[key] = figure_name(key, set(names.values()))
                captures = [Capture(CaptureKey("sae", "curves", "sae", names[k]),
                                    torch.tensor([float(v)], dtype=torch.float64), False, dims=("step",))
                            for k, v in figures.items() if k in names]
                writer.put(StepRecord(step=step, sample_index=np.array([step], dtype=np.int64), target=None,
                                      path=None, captures=captures))
                written[0] += 1
            if should_stop():
                raise _Stop

        device = str(self.ctx.device)
        from hookrun.runner.kinds.sae.prefetch import Prefetch

        # a cache's next batches are read (and, on a GPU, copied over from pinned memory) while the step runs
        self.batches = Prefetch(self.rows, self.ctx.device) if self.cache_rows else self.rows
        name = sae_meta(self.rows, self.module, self.ctx.cfg.model)  # (hook_name MODULE/ROLE: not its output)
        train = Training(self.block, self.rows.d_in, name, self.batches,
                         checkpoint_path=str(self.checkpoints) if self.block.checkpoints else None, device=device,
                         on_step=on_step)
        if first_row:
            self.resume_from(train, first_row)
        else:  # a run started afresh (output.overwrite): an earlier run's checkpoints are not this one's to resume,
            clear_checkpoints(self.checkpoints)  # nor its SAE (sae.overwrite) this one's: a kill would leave it as if new
            self.remove_old_sae()
        try:
            sae = train.fit(progress=bool(self.ctx.cfg.progress))
        except _Stop:
            return written[0]
        self.remove_old_sae()
        save_sae(sae, self.out)
        trainer = train.trainer
        if silent := silent_features(trainer, trainer.n_training_steps):
            log.warning("sae: %d of %d latents did not fire in the last %d training steps (silent_features; SAELens' "
                        "dead_features counts a latent only after dead_feature_window=%d silent steps)", silent,
                        self.block.d_sae, silence_window(trainer, trainer.n_training_steps), trainer.cfg.dead_feature_window)
        mark_sweep_out(self.out)
        if not self.cache_rows:
            log.info("sae: %d pass(es) over the data on the fly", self.rows.epochs)
        log.info("sae: %s written (%s, d_in %d, d_sae %d)", self.out, sae.cfg.architecture(), self.rows.d_in,
                 self.block.d_sae)
        if self.block.evaluate:
            self.evaluate()
        return written[0]

    def remove_old_sae(self) -> None:
        if self.out.exists() and self.block.overwrite:
            for name in ("cfg.json", "sae_weights.safetensors", SWEEP_MARK):
                (self.out / name).unlink(missing_ok=True)

    def evaluate(self) -> None:
        """sae.evaluate: the evaluate kind's run on the SAE just written (evaluation.py)."""
        from hookrun.runner.kinds.sae.evaluation import evaluate_sae

        cfg = self.ctx.cfg
        live = self.ctx.model if isinstance(cfg.model, dict) and "live" in cfg.model else None
        try:
            self.evaluation = evaluate_sae(cfg, self.block.evaluate, self.out, self.module,
                                           self.out.with_name(self.out.name + ".evaluation.h5"), model=live,
                                           arg=spliced_arg(self.rows))
        except HookrunError as exc:  # (the training is done and its SAE written: say where, and how to evaluate it)
            raise type(exc)(f"sae.evaluate, after the training (the SAE is written to {self.out}): {exc}; evaluate it "
                            f"again with experiment=sae_eval params.sae={self.out}") from exc.__cause__
        m, s = self.evaluation["model"], self.evaluation["splice"]
        log.info("sae: evaluated on %d held-out item(s): ce_loss_score %.4g, kl_div_score %.4g, l0 %.4g, "
                 "explained_variance %.4g (%s)", self.evaluation["items"], m.get("ce_loss_score", float("nan")),
                 m.get("kl_div_score", float("nan")), s.get("l0", float("nan")),
                 s.get("explained_variance", float("nan")), self.evaluation["file"])

    def end_attrs(self) -> dict[str, Any]:
        return {"sae_evaluation": json.dumps(self.evaluation)} if self.evaluation else {}

    def restore(self, resume: Any, kept: int) -> None:
        """An object-store run's old cache identity, compared here (a local file's in check(), before the model)."""
        if self.cache_rows and "sae" in resume.attrs and scheme_of(str(self.ctx.cfg.output.path)).remote:
            from hookrun.runner.kinds.sae.resuming import cache_identity, check_cache

            old = {**json.loads(resume.attrs["sae"]), "file": str(self.ctx.cfg.output.path)}
            check_cache(old, cache_identity(self.rows), str(self.block.from_))

    def resume_from(self, train: Any, kept: int) -> None:
        """Load the last whole checkpoint at or before `kept` steps and skip the rows it has read."""
        done = 0
        for folder in checkpoints_before(self.checkpoints, kept * self.block.batch_rows):
            try:
                train.resume(folder)
            except Exception as exc:  # a checkpoint cut short by the kill: the one before it
                log.warning("sae: checkpoint %s unreadable (%s); trying the one before", folder, exc)
                continue
            # SAELens saves before it counts the step: the steps done are its samples / batch
            done = train.trainer.n_training_steps = train.trainer.n_training_samples // self.block.batch_rows
            break
        skip = done + (self.norm_rows() // self.block.batch_rows if done else 0)
        self.rows.skip(skip)
        log.info("resume: %s; %d training step(s) run again to the %d the file holds",
                 f"from checkpoint step {done}" if done else "no checkpoint: from the start", kept - done, kept)

    def close(self) -> None:
        getattr(self, "batches", self.rows).close()  # (the prefetch thread ends first, then the rows close)


class _Stop(Exception):
    """A signal asked the run to stop after the step in flight."""


def run_folder(cfg: HookrunConfig, name: str | None = None) -> Path:
    """The run file's folder; with `name`, its folder NAME/ beside captures.h5 (the default file), STEM.NAME/
    beside any other file: two runs written to one folder never share (nor clear) checkpoints or an SAE."""
    path = str(cfg.output.path)
    if scheme_of(path).remote:
        raise ConfigError("sae.out: the run is written to an object store; give sae.out, a local folder for the SAE")
    file = Path(path).resolve()
    return file.parent if name is None else file.parent / (name if file.name == "captures.h5" else f"{file.stem}.{name}")


def out_folder(cfg: HookrunConfig) -> Path:
    """sae.out (relative to where you run; in a Hydra multirun, to each job's folder, so the jobs of a
    sweep never write one folder in turn), or run_folder's sae/."""
    if not cfg.sae.out:
        return run_folder(cfg, "sae")
    out, job = Path(local_path(cfg.sae.out)), multirun_job_folder()  # (a URL is refused in block.check)
    return job / out if job is not None and not out.is_absolute() else out.resolve()
