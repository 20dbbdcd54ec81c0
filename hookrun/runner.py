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
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun import __version__
from hookrun.actions import ActionEnv
from hookrun.actions.record import Record
from hookrun.build import build_dataset, build_loss, build_model, import_modules
from hookrun.config import HookrunConfig, load, to_yaml
from hookrun.data import check_item, make_loader
from hookrun.errors import ConfigError
from hookrun.estimate import estimate
from hookrun.loop import LoopSettings, run_batches
from hookrun.plan import HookPoint, make_plan
from hookrun.resume import ResumeState, open_resume, replay
from hookrun.session import HookSession
from hookrun.signals import Interrupted, StopSignals
from hookrun.spec import parse_hooks
from hookrun.store import H5Store
from hookrun.writer import BackgroundWriter

log = logging.getLogger("hookrun")

STORE_DTYPES = {"keep": None, "float16": torch.float16, "float32": torch.float32}


@dataclass
class RunResult:
    path: Path
    steps: int
    samples: int
    seconds: float
    estimated_bytes: int | None = None  # set by dry_run
    status: str = "complete"


@dataclass
class Prepared:
    """Everything a run needs, built and checked, before the file is touched."""

    cfg: HookrunConfig
    out: Path
    model: torch.nn.Module
    dataset: Any
    loader: Any
    points: list[HookPoint]
    env: ActionEnv
    settings: LoopSettings
    n_batches: int
    n_samples: int


def run(cfg: Any) -> RunResult:
    started = time.perf_counter()
    cfg = load(cfg)
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
        p = prepare(cfg, check_exists=resume is None)
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


def prepare(cfg: HookrunConfig, check_exists: bool = True) -> Prepared:
    import_modules(cfg.imports)
    specs = parse_hooks(cfg.hooks)
    mode = cfg.mode.value
    device = resolve_device(cfg.device)
    if mode == "grad" and cfg.loss is None:
        raise ConfigError("mode=grad needs a loss: add loss=cross_entropy, loss=sum, loss=target_logit or loss=custom")
    if cfg.data.limit is not None and cfg.data.limit < 1:
        raise ConfigError(f"data.limit must be at least 1 (or null for all batches), got {cfg.data.limit}")
    if cfg.output.flush_every is not None and cfg.output.flush_every < 1:
        raise ConfigError(f"output.flush_every must be at least 1 (or null: every 2 seconds), got {cfg.output.flush_every}")
    out = check_output(cfg.output.path, cfg.output.overwrite or not check_exists, create=not cfg.dry_run)

    seed_everything(cfg.seed)
    model = build_model(cfg.model, device)
    if mode == "grad":
        disable_inplace(model)
    dataset = build_dataset(cfg.data.dataset)
    if len(dataset) == 0:
        raise ConfigError(f"data.dataset: {cfg.data.dataset['_target_']!r} is empty")
    check_item(dataset[0])
    loader = make_loader(dataset, cfg.data.batch_size, cfg.data.num_workers)
    loss = build_loss(cfg.loss) if mode == "grad" else None
    n_batches = len(loader) if cfg.data.limit is None else min(cfg.data.limit, len(loader))
    planned = np.arange(min(len(dataset), n_batches * cfg.data.batch_size))
    env = ActionEnv(store_dtype=STORE_DTYPES[cfg.output.dtype.value], planned_samples=planned)
    try:
        points = make_plan(model, specs, env, mode)
        if cfg.early_stop:
            check_early_stop(points, mode)
    except BaseException:
        env.close()
        raise
    settings = LoopSettings(mode, device, loss, n_batches, cfg.progress)
    return Prepared(cfg, out, model, dataset, loader, points, env, settings, n_batches, len(planned))


def plan_estimate(p: Prepared):
    report = estimate(p.model, p.loader, p.points, p.env, p.settings, p.n_samples, p.n_batches)
    cfg = p.cfg
    report.header = [
        "hookrun plan" + (" (dry run: nothing is written)" if cfg.dry_run else ""),
        f"  model   {type(p.model).__module__}.{type(p.model).__qualname__} on {p.settings.device}, mode {p.settings.mode}",
        f"  data    {cfg.data.dataset['_target_']}: {len(p.dataset)} samples; this run: {p.n_samples} samples in {p.n_batches} batches of {cfg.data.batch_size}",
        f"  output  {p.out} (compression {cfg.output.compression.value})",
    ]
    return report


def check_max_bytes(total: int, limit: int) -> None:
    if total > limit:
        from hookrun.analysis.show import human_bytes

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


def check_early_stop(points: list, mode: str) -> None:
    if mode != "eval":
        raise ConfigError("early_stop=true needs mode=eval: a backward pass needs the whole forward")
    for p in points:
        if p.type not in ("forward", "forward_pre") or not all(isinstance(a, Record) for a in p.actions):
            raise ConfigError(
                f"early_stop=true needs hooks that only record (forward or forward_pre with record actions); "
                f"hooks.{p.hook} is type {p.type} with {[type(a).__name__ for a in p.actions]}"
            )


def resolve_device(name: str) -> torch.device:
    name = str(name).strip()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: {name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={name}: CUDA is not available on this machine; use device=cpu or device=auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device={name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={name}: MPS is not available on this machine; use device=cpu or device=auto")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device: {name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


def check_output(path: str, overwrite: bool, create: bool = True) -> Path:
    out = Path(path).expanduser()
    if out.exists() and not overwrite:
        raise ConfigError(f"output.path: {str(out)!r} exists; set output.overwrite=true, resume=true, or choose another path")
    if out.is_dir():
        raise ConfigError(f"output.path: {str(out)!r} is a folder; give a file path such as captures.h5")
    if not create:
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"output.path: cannot create the folder {str(out.parent)!r}: {exc.strerror}") from None
    if not os.access(out.parent, os.W_OK):
        raise ConfigError(f"output.path: the folder {str(out.parent)!r} is not writable")
    return out


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def disable_inplace(model: torch.nn.Module) -> None:
    """Turn off `inplace=True` (ReLU and friends): the numbers are the same, and full backward
    hooks cannot follow a tensor that a later module overwrites."""
    for module in model.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False


def file_attrs(cfg: HookrunConfig, model: torch.nn.Module, device: torch.device) -> dict:
    return {
        "config": to_yaml(cfg),
        "hookrun_version": __version__,
        "torch_version": torch.__version__,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "device": str(device),
        "mode": cfg.mode.value,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
