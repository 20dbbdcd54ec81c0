"""run(cfg): the whole capture run, from a validated config to a complete HDF5 file.

    from hookrun import run
    result = run({"model": {...}, "data": {...}, "hooks": {...}, "output": {"path": "x.h5"}})

Hydra-free: the CLI composes the config and calls this; tests and notebooks call it directly.
Everything that can be checked is checked before the first batch. SIGINT and SIGTERM finish the
batch in flight, flush, mark the file `interrupted` and raise Interrupted; `resume=true` goes on
from there.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hookrun.analysis.stats import human_bytes
from hookrun.capture.actions.record import Record
from hookrun.capture.plan import HookPoint
from hookrun.capture.session import HookSession
from hookrun.config.schema import HookrunConfig, load, to_yaml, with_live
from hookrun.errors import ConfigError
from hookrun.runner.estimate import estimate
from hookrun.runner.loop import run_batches
from hookrun.runner.prepare import Prepared, dataset_name, prepare
from hookrun.runner.resume import ResumeState, open_resume, replay
from hookrun.runner.signals import Interrupted, StopSignals
from hookrun.store.format import HOOKRUN_VERSION
from hookrun.store.h5store import H5Store
from hookrun.store.writer import BackgroundWriter

log = logging.getLogger("hookrun")


@dataclass
class RunResult:
    path: Path
    steps: int
    samples: int
    seconds: float
    estimated_bytes: int | None = None  # set by dry_run
    status: str = "complete"


def run(cfg: Any, model: torch.nn.Module | None = None, dataset: Any = None) -> RunResult:
    """Run `cfg`; `model` and `dataset`, where given, are live objects used instead of the config's
    model and data.dataset nodes (which may then be left out)."""
    started = time.perf_counter()
    cfg = load(with_live(cfg, model, dataset))
    resume = None
    out = Path(cfg.output.path).expanduser()
    if cfg.resume:
        resume = open_resume(out, to_yaml(cfg))
        if resume is not None and resume.status == "complete":
            resume.close()
            log.info("resume: %s is already complete; nothing to do", out)
            return RunResult(out, resume.steps, 0, 0.0, status="complete")
        if resume is None:
            log.info("resume: no file at %s; starting from the first batch", out)
    try:
        p = prepare(cfg, check_exists=resume is None, model=model, dataset=dataset)
    except BaseException:
        if resume is not None:
            resume.close()
        raise
    try:
        if cfg.dry_run or cfg.output.max_bytes is not None:
            report = plan_estimate(p)
            if cfg.dry_run:
                print(report.text(), flush=True)
                return RunResult(p.out, 0, 0, time.perf_counter() - started, estimated_bytes=report.total_bytes, status="dry_run")
            check_max_bytes(report.total_bytes, cfg.output.max_bytes)
        return execute(p, resume, started)
    finally:
        p.env.close()
        if resume is not None:
            resume.close()


def plan_estimate(p: Prepared):
    report = estimate(p.model, p.loader, p.points, p.env, p.settings, p.n_samples, p.n_batches)
    cfg = p.cfg
    report.header = [
        "hookrun plan" + (" (dry run: nothing is written)" if cfg.dry_run else ""),
        f"  model   {type(p.model).__module__}.{type(p.model).__qualname__} on {p.settings.device}, mode {p.settings.mode}",
        f"  data    {dataset_name(cfg)}: {len(p.dataset)} samples; this run: {p.n_samples} samples in {p.n_batches} batches of {cfg.data.batch_size}",
        f"  output  {p.out} (compression {cfg.output.compression.value})",
    ]
    return report


def check_max_bytes(total: int, limit: int) -> None:
    if total > limit:
        raise ConfigError(
            f"output.max_bytes: the estimated file size {human_bytes(total)} ({total} bytes) exceeds "
            f"output.max_bytes={limit}; record less (what, select, reduce, dtype, every, limit, data.limit) "
            f"or raise output.max_bytes (dry_run=true shows the estimate per capture)"
        )


def execute(p: Prepared, resume: ResumeState | None, started: float) -> RunResult:
    cfg = p.cfg
    log.info("%s on %s, %d hook point(s), writing %s", type(p.model).__name__, p.settings.device, len(p.points), p.out)
    if not any(isinstance(a, Record) for pt in p.points for a in pt.actions):
        log.warning("no hook records anything: the file will hold the sample index and targets only")
    target = p.out.with_name(p.out.name + ".resuming") if resume is not None else p.out
    try:
        store = H5Store(target, file_attrs(cfg, p.model, p.settings.device), cfg.output.compression.value, cfg.output.flush_every,
                        expected_samples=p.n_samples, expected_steps=p.n_batches)
    except OSError as exc:
        raise ConfigError(f"output.path: cannot create {str(target)!r}: {exc}") from None
    status, steps, replayed = "failed", 0, False
    stop = StopSignals()
    try:
        first = 0
        if resume is not None:
            first = replay(resume, store)
            restore_limits(p.points, store)
            log.info("resume: %d batches from %s kept; going on from batch %d", first, p.out, first)
        replayed = True
        with stop, HookSession(p.points, p.env, cfg.early_stop) as session, BackgroundWriter(store) as writer:
            p.settings.should_stop = stop.requested
            steps = run_batches(p.model, p.loader, session, writer, p.env, p.settings, first)
        status = "interrupted" if stop.signum else "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        samples = store.samples
        close_quietly(store, status)
        if resume is not None and replayed:
            os.replace(target, p.out)  # the new file holds the old batches too
        elif resume is not None:
            target.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    log.info("%s: %d batches, %d samples, %.1f MB in %.1f s", status, steps, samples, p.out.stat().st_size / 1e6, seconds)
    if stop.signum:
        raise Interrupted(stop.signum, p.out, steps)
    return RunResult(p.out, steps, samples, seconds, status=status)


def close_quietly(store: H5Store, status: str) -> None:
    try:
        store.close(status)
    except Exception as exc:  # e.g. a full disk: the file keeps its last flush
        log.error("could not mark %s as %s: %s", store.path, status, exc)


def restore_limits(points: list[HookPoint], store: H5Store) -> None:
    """Give `record limit=N` the rows the replayed batches already hold."""
    for key_path, rows in store.rows_by_key().items():
        hook, module, role, call = key_path
        for p in points:
            if p.hook == hook and p.name == module:
                for action in p.actions:
                    if isinstance(action, Record):
                        action.restore_rows(role, call, rows)


def file_attrs(cfg: HookrunConfig, model: torch.nn.Module, device: torch.device) -> dict:
    return {
        "config": to_yaml(cfg),
        "hookrun_version": HOOKRUN_VERSION,
        "torch_version": torch.__version__,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "device": str(device),
        "mode": cfg.mode.value,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
