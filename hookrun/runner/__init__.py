"""The data loop: run(cfg), prepare, batches and the forward call, the loop, the kinds, the estimate, losses.
It ties config/, hooks/, output/ and store/ together; only cli/ and the package root import it.

The package itself holds run(cfg): the whole capture run, from a validated config to a complete HDF5 file.

    from hookrun import run
    result = run({"model": {...}, "data": {...}, "hooks": {...}, "output": {"path": "x.h5"}})

Hydra-free: the CLI composes the config and calls this; tests and notebooks call it directly.
Everything that can be checked is checked before the first batch. SIGINT and SIGTERM finish the
batch in flight, flush, mark the file `interrupted` and raise Interrupted; `resume=true` goes on
from there.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hookrun.config import load, with_live
from hookrun.config.schema import HookrunConfig, to_yaml
from hookrun.errors import RunError, StoreError, article
from hookrun.hooks.actions import ModelHold
from hookrun.hooks.session import HookSession
from hookrun.output import accepted, open_destination
from hookrun.output.process import (
    Interrupted,
    StopSignals,
    StoreAway,
    after_close,
    detect,
    setup_stops,
)
from hookrun.runner.kinds import check_config, kind_for
from hookrun.runner.loop import end_report, run_batches
from hookrun.runner.prepare import Prepared, prepare
from hookrun.store import BATCH_UNITS, HOOKRUN_VERSION
from hookrun.store.records import RunStore
from hookrun.store.writer import BackgroundWriter

if TYPE_CHECKING:  # resume=true and many ranks load theirs where the run asks for them
    from hookrun.output.interface import Destination
    from hookrun.output.resume import Resume

log = logging.getLogger("hookrun")


@dataclass
class RunResult:
    path: Path | str  # the file, or the object-store URL
    steps: int
    samples: int
    seconds: float
    estimated_bytes: int | None = None  # set by dry_run
    status: str = "complete"
    note: str = ""  # the kind's summary for the run's last log line (an edges run's recovered fractions)
    signum: int | None = None  # a SIGTERM/SIGINT that came in the last batch (complete all the same): rank 0 then waits briefly


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
    # the one owner of what the run attaches to the model: hooks, splices, unfused attention, and a
    # live model's own state (mode, flags, devices, grads), all undone on the way out (hooks/actions/__init__.py: ModelHold);
    # out of a caller's torch.inference_mode(), where no kind could take a gradient (each sets its grad mode)
    with torch.inference_mode(False), ModelHold(model) as hold:
        dest = open_destination(cfg, ranks)  # output.path, resolved once: a local file or object-store parts
        body = lambda c, d, adjust=None: _locked(c, d, started, model, dataset, hold, adjust)  # noqa: E731
        if ranks.many:  # one rank of torchrun / submitit / srun: its block, then (rank 0) the whole run
            from hookrun.output.shards import ShardRun

            return ShardRun(cfg, ranks, dest.shards(cfg, ranks)).run(body)
        return body(cfg, dest)


def _locked(cfg: HookrunConfig, dest: Destination, started: float, model: torch.nn.Module | None, dataset: Any,
            hold: ModelHold, adjust: Callable[[Prepared], None] | None = None) -> RunResult:
    """_run under the destination's lock: one writer per output, held until the store is closed."""
    try:
        if cfg.resume:  # (the config's refusals, resume=true output.overwrite=true among them, before the old run is read)
            check_config(cfg)
            dest.check_resume()
        if cfg.dry_run:
            return _run(cfg, dest, started, model, dataset, hold, adjust)
        dest.check_place()
        with setup_stops(), dest.locked():
            return _run(cfg, dest, started, model, dataset, hold, adjust)
    except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM before the file was created or after it was closed (between: Interrupted)
        return RunResult(dest.result, seconds=time.perf_counter() - started, **after_close(e, dest, cfg.resume))


def _run(cfg: HookrunConfig, dest: Destination, started: float, model: torch.nn.Module | None, dataset: Any,
         hold: ModelHold, adjust: Callable[[Prepared], None] | None = None) -> RunResult:
    resume, rejoin = None, False
    if cfg.resume and not cfg.dry_run:  # _locked holds the destination's lock
        resume = dest.open_resume(to_yaml(cfg))
        done = resume is not None and resume.status == "complete"
        # a complete shard of rank 1..N-1 whose kind hands its rows to rank 0: rebuilt for rank 0 (rejoin)
        rejoin = done and adjust is not None and detect().rank > 0 and kind_for(cfg).hands_over
        if done and not rejoin:
            resume.close()
            log.info("resume: %s is already complete; nothing to do", dest)
            return RunResult(dest.result, resume.steps, 0, 0.0, status="complete")
        if resume is None:
            log.info("resume: no file at %s; starting from the first batch", dest)
    try:
        p = prepare(cfg, check_exists=resume is None, model=model, dataset=dataset, out=dest, hold=hold)
    except BaseException:
        if resume is not None:
            resume.close()
        raise
    try:
        if adjust is not None:
            adjust(p)
        if not cfg.dry_run:  # what the kind sets up beyond the loop (its base runs and checks)
            p.settings.kind.prepare_run(p)
        if rejoin:  # (the shard file stays as it was)
            p.settings.kind.rejoin(resume, resume.steps)
            return RunResult(dest.result, 0, 0, time.perf_counter() - started)
        if cfg.dry_run or cfg.output.max_bytes is not None:
            from hookrun.runner.estimate import plan_estimate  # (only these runs estimate)

            report = plan_estimate(p, {**file_attrs(cfg, p.model, p.settings.device), **class_names(p.dataset), **p.attrs})
            if cfg.dry_run:
                print(report.text(), flush=True)
                return RunResult(dest.result, 0, 0, time.perf_counter() - started, estimated_bytes=report.total_bytes, status="dry_run")
            report.check_max_bytes(cfg.output.max_bytes)
        return execute(p, resume, started)
    finally:
        p.settings.kind.close()
        p.env.close()
        if resume is not None:
            resume.close()


def execute(p: Prepared, resume: Resume | None, started: float) -> RunResult:
    """Write the run. The caller holds the destination's lock; a local file appears under its name
    only once it opens, and a resumed file replaces the old one only once it holds its batches; an
    object-store run is written in parts uploaded as they finish (output/__init__.py)."""
    cfg, dest = p.cfg, p.out
    has = f"{len(p.points)} hook point(s)" if p.points or not p.settings.kind.adds else f"{article(p.settings.kind.name)} run ({p.settings.kind.units[1]})"
    log.info("%s on %s, %s, writing %s", type(p.model).__name__, p.settings.device, has, dest)
    if not any(a.records for pt in p.points for a in pt.actions) and not (p.settings.kind.adds or p.settings.kind.block):
        log.warning("no hook records anything: the file will hold the sample index and targets only")
    if resume is None:
        dest.check_still_free(cfg.output.overwrite)
    status, steps, replayed, away = "failed", 0, False, None
    session = HookSession(p.points, p.env, cfg.early_stop)
    with StopSignals() as stop:  # from before the file exists: a first signal then stops after one batch
        store = open_store(p, resume)
        accepted()  # the output is this run's: the CLI now writes Hydra's record of it (output/__init__.py)
        try:
            first = p.batches.start  # 0, or where this rank's shard starts
            if resume is not None:
                kept = resume.replay(store)
                p.settings.kind.restore(resume, kept)
                first += kept
                # (only a resumed run loads these)
                from hookrun.runner.action_state import restore_limits, restore_states

                restore_limits(p.points, store)
                restore_states(p.env, getattr(resume, "file", None), kept, store)  # top_examples' running state
                log.info("resume: %d %s from %s kept; going on from step %d", kept, p.settings.kind.units[0], dest, first)
                dest.adopt(store)
            replayed = True
            with session, BackgroundWriter(store) as writer:
                p.settings.should_stop = stop.requested
                steps = p.settings.kind.run_steps(  # the data loop, unless the kind's steps are not batches (a grid's cells)
                    lambda: run_batches(p.model, p.loader, session, writer, p.env, p.settings, first),
                    writer, store.samples, stop.requested)
            stopped = stop.signum and not (p.settings.kind.units == BATCH_UNITS and first + steps >= p.batches.stop)  # (a signal in the last batch, a probe's fit, cut nothing short)
            late = p.settings.kind.end_attrs()  # (the writer has drained: this thread owns the file again)
            if late:
                end_attrs(store, late)
            status = "interrupted" if stopped else "complete"
            if status == "complete" and p.env.stateful:  # end-of-run captures (top_examples), once
                from hookrun.runner.action_state import finish_actions
                finish_actions(p.env, store)
        except StoreError as exc:  # the object store stayed away: the parts not uploaded stay local
            status, away = "interrupted", exc
        except KeyboardInterrupt:  # a second signal (or Ctrl-C outside the loop): the writer has ended
            status, steps = "interrupted", store.steps - (first - p.batches.start) if replayed else 0  # (this session's)
        finally:
            with stop.shielded():  # a signal now only waits: the file is closed whole
                samples = store.samples
                if replayed:
                    end_attrs(store, end_report(session, store, resume, complete=status == "complete"))
                lost = close_quietly(store, status)  # (a RunError: the last rows never reached the disk)
                status, away = ("failed", away) if isinstance(lost, RunError) else (status, lost or away)
                dest.end(resume, replayed)
                dest.closed = (("interrupted" if away else status) if replayed else None, steps if status == "complete" else store.steps, samples, p.settings.kind.units[0])
    seconds = time.perf_counter() - started
    steps_unit, rows_unit = p.settings.kind.units
    done = f"{steps} {steps_unit}, {samples} {rows_unit}"
    if resume is not None and replayed:  # this session's batches, the whole file's rows: say which is which
        done = f"{steps} {steps_unit} run now ({store.steps} in the file), {samples} {rows_unit} in the file"
    log.info("%s: %s, %.1f MB in %.1f s", "interrupted" if away else status, done, dest.size(store) / 1e6, seconds)
    if away is not None or isinstance(lost, RunError):
        raise lost if isinstance(lost, RunError) else StoreAway(str(away))
    if status == "interrupted":
        if not replayed:  # stopped while the old batches were copied: the old file is as it was
            raise Interrupted(stop.signum or signal.SIGINT, None, 0, resumed_from=dest.result)
        raise Interrupted(stop.signum or signal.SIGINT, dest.result, store.steps, unit=steps_unit)
    return RunResult(dest.result, steps, samples, seconds, status=status, note=p.settings.kind.end_note(), signum=stop.signum)


def open_store(p: Prepared, resume: Resume | None) -> RunStore:
    """The run's store, where its destination keeps it (for a resume: the old batches replayed first)."""
    cfg = p.cfg
    attrs = {**file_attrs(cfg, p.model, p.settings.device), "kind": p.settings.kind.name, **class_names(p.dataset),
             **p.attrs}  # readers ask the kind
    kwargs = {"compression": cfg.output.compression.value, "flush_every": cfg.output.flush_every,
              "expected_samples": p.n_samples, "expected_steps": p.n_batches, "checksum": cfg.output.checksum}
    return p.out.open_store(attrs, resume, cfg.output.part_bytes, **kwargs)


def end_attrs(store: RunStore, attrs: dict) -> None:
    try:
        store.set_attrs(attrs)
    except Exception as exc:  # e.g. a full disk: closing the file matters more
        log.error("could not write %s to %s: %s", ", ".join(attrs), store.path, exc)


def close_quietly(store: RunStore, status: str) -> StoreError | RunError | None:
    """Close the store; an object store that stayed away is returned (the run is then interrupted), a failed last flush of a complete run as a RunError."""
    try:
        store.close(status)
    except StoreError as exc:
        return exc
    except Exception as exc:  # e.g. a full disk: the file keeps its last flush
        if status == "complete":
            from hookrun.error_words import write_reason  # (loaded only when the last flush failed)

            return RunError(f"writing {store.path} failed as it was closed: {write_reason(exc)}; it keeps the batches of its last flush, as a killed run's file does: resume=true once there is room")
        log.error("could not mark %s as %s: %s", store.path, status, exc)
    return None


def class_names(dataset: Any) -> dict:
    """{"class_names": JSON list} where the data set names its classes (torchvision's and data=shapes'
    `classes`: a list of strings), so pictures caption classes by name; {} otherwise."""
    names = getattr(dataset, "classes", None)
    named = isinstance(names, list | tuple) and 0 < len(names) <= 100_000 and all(isinstance(n, str) for n in names)
    return {"class_names": json.dumps(list(names))} if named else {}


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
