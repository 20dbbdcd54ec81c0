"""run(cfg): the whole capture run, from a validated config to a complete HDF5 file.

    from hookrun import run
    result = run({"model": {...}, "data": {...}, "hooks": {...}, "output": {"path": "x.h5"}})

Hydra-free: the CLI composes the config and calls this; tests and notebooks call it directly.
Everything that can be checked is checked before the first batch. SIGINT and SIGTERM finish the
batch in flight, flush, mark the file `interrupted` and raise Interrupted; `resume=true` goes on
from there.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hookrun.analysis.stats import human_bytes
from hookrun.config.schema import HookrunConfig, load, to_yaml, with_live
from hookrun.errors import ConfigError
from hookrun.hooks.plan import HookPoint
from hookrun.hooks.session import HookSession
from hookrun.runner.end_warnings import end_report
from hookrun.runner.estimate import estimate
from hookrun.runner.live import borrowed
from hookrun.runner.loop import run_batches
from hookrun.runner.prepare import Prepared, check_output, dataset_name, prepare
from hookrun.runner.ranks import detect
from hookrun.runner.resume import PartsResume, ResumeState, open_parts_resume, open_resume, replay
from hookrun.runner.shard_parts import PartsShardRun
from hookrun.runner.shards import ShardRun, check_not_a_view
from hookrun.runner.signals import Interrupted, StopSignals, StoreAway
from hookrun.store.format import HOOKRUN_VERSION
from hookrun.store.h5file import flushing_path
from hookrun.store.h5store import H5Store
from hookrun.store.lock import OutputLock
from hookrun.store.parts import Output, PartedStore, check_remote_output
from hookrun.store.remote import StoreError, is_url
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
    """Run a config: build (or take) the model and data, hook it, loop, and write one HDF5 file.

        result = run({"hooks": {...}, "output": {"path": "captures.h5"}}, model=model, dataset=ds)
        result.path, result.steps, result.samples

    Args:
        cfg: a mapping (or DictConfig, or `hookrun.compose(...)`'s dict) with the keys of
            conf/config.yaml; missing keys take their defaults.
        model: a live nn.Module used instead of cfg's `model` node (which may then be left out);
            it comes back as it went in (mode, inplace flags, devices, gradients).
        dataset: a live map-style dataset used instead of `data.dataset`.

    Returns:
        RunResult: the file's path, batches and samples written, seconds, and status
        ("complete", or "dry_run" with `estimated_bytes`).

    Raises:
        ConfigError: anything that can be checked before the first batch (exit 2 on the CLI).
        RunError: a batch that failed; the file keeps every batch before it, marked "failed".
        Interrupted: SIGINT or SIGTERM; the file is marked "interrupted" and `resume=true` goes on.
    """
    started = time.perf_counter()
    cfg = load(with_live(cfg, model, dataset))
    ranks = detect()
    with borrowed(model):  # a live model comes back as it went in (mode, flags, devices, grads)
        if ranks.many and is_url(cfg.output.path):  # one rank's parts, then (rank 0) the top manifest
            body = lambda c, adjust: _locked_parts(c, started, model, dataset, adjust, ranks.rank)  # noqa: E731
            return PartsShardRun(cfg, ranks).run(body)
        if ranks.many:  # one rank of torchrun / submitit / srun: its shard, then (rank 0) the merged view
            return ShardRun(cfg, ranks).run(lambda c, adjust: _locked(c, started, model, dataset, adjust))
        if is_url(cfg.output.path):
            return _locked_parts(cfg, started, model, dataset)
        if cfg.resume:
            check_not_a_view(Path(cfg.output.path).expanduser())
        return _locked(cfg, started, model, dataset)


def _locked(cfg: HookrunConfig, started: float, model: torch.nn.Module | None, dataset: Any,
            adjust: Callable[[Prepared], None] | None = None) -> RunResult:
    """_run under the output's lock: one writer per file, held until the file is closed."""
    out = Path(cfg.output.path).expanduser()
    try:
        if cfg.dry_run:
            return _run(cfg, out, started, model, dataset, adjust)
        check_output(out, overwrite=True)  # a name it can have, its folder made: the lock file goes there
        with OutputLock(real_path(out)):
            return _run(cfg, out, started, model, dataset, adjust)
    except KeyboardInterrupt:  # Ctrl-C before the file was created (later ones raise Interrupted)
        raise Interrupted(signal.SIGINT, None, 0, resumed_from=out if cfg.resume and out.exists() else None) from None


def _locked_parts(cfg: HookrunConfig, started: float, model: torch.nn.Module | None, dataset: Any,
                  adjust: Callable[[Prepared], None] | None = None, rank: int | None = None) -> RunResult:
    """A run in an object store (store/parts.py): the store checked before anything else, then
    _run under a lock on the local staging folder (`rank`: one rank's parts of a many-process run)."""
    out = dataclasses.replace(Output.of(cfg.output.path, cfg.output.staging), rank=rank)
    try:
        if cfg.dry_run:
            return _run(cfg, out, started, model, dataset, adjust)
        check_remote_output(out, overwrite=cfg.output.overwrite, resume=cfg.resume)
        with OutputLock(out.parts_dir):
            return _run(cfg, out, started, model, dataset, adjust)
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT, None, 0) from None


def _run(cfg: HookrunConfig, out: Path | Output, started: float, model: torch.nn.Module | None, dataset: Any,
         adjust: Callable[[Prepared], None] | None = None) -> RunResult:
    resume = None
    if cfg.resume and not cfg.dry_run:  # _locked has checked the path and taken its lock
        resume = open_parts_resume(out, to_yaml(cfg)) if isinstance(out, Output) else open_resume(out, to_yaml(cfg))
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
    if isinstance(out, Output) and isinstance(p.out, Output):
        p.out = out  # the same place, with the store's folder opened and checked before: one client a run
    try:
        if adjust is not None:
            adjust(p)
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
    report = estimate(p.model, p.loader, p.points, p.env, p.settings, p.n_samples)
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


def execute(p: Prepared, resume: ResumeState | PartsResume | None, started: float) -> RunResult:
    """Write the file. The caller holds the output's lock (OutputLock); the file appears under its
    name only once it opens, and a resumed file replaces the old one only once it holds its batches.
    An object-store output (store/parts.py) is written in parts uploaded as they finish."""
    cfg = p.cfg
    log.info("%s on %s, %d hook point(s), writing %s", type(p.model).__name__, p.settings.device, len(p.points), p.out)
    if not any(a.records for pt in p.points for a in pt.actions):
        log.warning("no hook records anything: the file will hold the sample index and targets only")
    local = not isinstance(p.out, Output)
    real = target = None
    if local:
        real = real_path(p.out)  # through a symlink: the link stays, its target is written
        if resume is None:
            check_output(p.out, cfg.output.overwrite)  # again, now that the model is built: still ours to write
        target = real.with_name(real.name + ".resuming") if resume is not None else real
    status, steps, replayed, at_once, away = "failed", 0, False, False, None
    session = HookSession(p.points, p.env, cfg.early_stop)
    with StopSignals() as stop:  # from before the file exists: a first signal then stops after one batch
        store = open_store(p, target, resume)
        try:
            first = p.batches.start  # 0, or where this rank's shard starts
            if resume is not None:
                kept = replay(resume, store)
                if p.settings.evaluator is not None:
                    p.settings.evaluator.restore(resume.file, kept)
                first += kept
                restore_limits(p.points, store)
                log.info("resume: %d batches from %s kept; going on from batch %d", kept, p.out, first)
            replayed = True
            with session, BackgroundWriter(store) as writer:
                p.settings.should_stop = stop.requested
                steps = run_batches(p.model, p.loader, session, writer, p.env, p.settings, first)
            status = "interrupted" if stop.signum else "complete"
        except StoreError as exc:  # the object store stayed away: the parts not uploaded stay local
            status, away = "interrupted", exc
        except KeyboardInterrupt:  # a second signal (or Ctrl-C outside the loop): the writer has ended
            status, at_once = "interrupted", True
        finally:
            with stop.shielded():  # a signal now only waits: the file is closed whole
                samples = store.samples
                if replayed:
                    end_attrs(store, end_report(session, store, resume, complete=status == "complete"))
                away = close_quietly(store, status) or away
                if local and resume is not None and replayed:
                    os.replace(target, real)  # the new file holds the old batches too
                    flushing_path(real).unlink(missing_ok=True)  # the old file, where a kill in a flush left it
                elif local and resume is not None:
                    target.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    size = p.out.stat().st_size if local else sum(part.bytes for part in store.manifest.parts)
    log.info("%s: %d batches, %d samples, %.1f MB in %.1f s", "interrupted" if away else status, steps, samples,
             size / 1e6, seconds)
    if away is not None:
        raise StoreAway(str(away))
    if stop.signum or at_once:
        if not replayed:  # stopped while the old batches were copied: the old file is as it was
            raise Interrupted(stop.signum or signal.SIGINT, None, 0, resumed_from=p.out)
        raise Interrupted(stop.signum or signal.SIGINT, p.out, store.steps)
    return RunResult(p.out if local else p.out.url, steps, samples, seconds, status=status)


def open_store(p: Prepared, target: Path | None, resume: ResumeState | PartsResume | None) -> H5Store | PartedStore:
    """The run's store: one HDF5 file at `target`, or parts uploaded to the object store p.out."""
    cfg = p.cfg
    attrs = {**file_attrs(cfg, p.model, p.settings.device), **p.attrs}
    kwargs = {"compression": cfg.output.compression.value, "flush_every": cfg.output.flush_every,
              "expected_samples": p.n_samples, "expected_steps": p.n_batches, "checksum": cfg.output.checksum}
    if isinstance(p.out, Output):
        point = resume.point if isinstance(resume, PartsResume) else None
        try:
            return PartedStore(p.out, attrs, cfg.output.part_bytes, point, **kwargs)
        except StoreError as exc:
            raise ConfigError(f"output.path: {exc}") from None
    try:
        return H5Store(target, attrs, **kwargs)
    except OSError as exc:
        raise ConfigError(f"output.path: cannot create {str(target)!r}: {exc}") from None


def real_path(out: Path) -> Path:
    """The file to write for output path `out`: the target of a symlink, else `out` itself."""
    return out.resolve() if out.is_symlink() else out


def end_attrs(store: H5Store, attrs: dict) -> None:
    try:
        store.set_attrs(attrs)
    except Exception as exc:  # e.g. a full disk: closing the file matters more
        log.error("could not write %s to %s: %s", ", ".join(attrs), store.path, exc)


def close_quietly(store: H5Store | PartedStore, status: str) -> StoreError | None:
    """Close the store; an object store that stayed away is returned (the run is then interrupted)."""
    try:
        store.close(status)
    except StoreError as exc:
        return exc
    except Exception as exc:  # e.g. a full disk: the file keeps its last flush
        log.error("could not mark %s as %s: %s", store.path, status, exc)
    return None


def restore_limits(points: list[HookPoint], store: H5Store) -> None:
    """Give `record limit=N` the rows the replayed batches already hold."""
    for key_path, rows in store.rows_by_key().items():
        hook, module, role, call = key_path
        for p in points:  # an op site MODULE/FN stored its calls as MODULE/FN.k
            if p.hook == hook and (p.module == module or (p.site is not None and module.rpartition(".")[0] == p.module)):
                for action in p.actions:
                    action.restore(role, call, rows, module)


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
