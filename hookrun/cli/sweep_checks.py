"""A multirun's jobs checked before the first one starts: each job's config, as Hydra's basic sweeper
will compose it, through the checks a run makes before it builds its model (runner/prepare.check_alone)
and its hook specs' checks that need no model (hooks/spec_check.py).

    python -m hookrun -m experiment=ablate_layer3 params.factor=0,abc,1
    hookrun: error: job 1 (params.factor=abc): hooks.ablate.actions.0: factor='abc' is not a number; ...

A refused job refuses the sweep before any job spends compute and before Hydra writes the sweep
folder (exit 2, one line per refusal, jobs with the same line named together). Called by the
SweepFolder callback (cli/app.py) at `on_multirun_start`. Only the basic sweeper's jobs are known in
advance (another sweeper chooses its jobs as it goes); a job whose config this process cannot
resolve (an interpolation only its launcher fills in) is left to its own run, which checks it again.
A job refused once it runs, before its output opened, keeps its line (`keep_refusal`, called by cli/app.py).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hookrun.config import SWEPT
from hookrun.errors import HookrunError
from hookrun.store import REFUSED

if TYPE_CHECKING:
    from hookrun.cli.around_hydra import RunRecord

log = logging.getLogger("hookrun")


def shared_output(raw: str, path: Path, folder: Path) -> str | None:
    """The line refusing a job's output.path (`raw`, without interpolation) that every job of the multirun
    shares: absolute, leaving the job's folder, or an object-store URL (was let through: with
    output.overwrite=true each job replaced the last one's run at the URL, and open_sweep read that run for
    every job); None where each job has its own."""
    from hookrun.store.paths import scheme_of

    url = scheme_of(raw).remote
    if not (url or path.is_absolute() or not (folder / path).resolve().is_relative_to(folder.resolve())):
        return None
    what = "is an object-store URL" if url else "is absolute" if path.is_absolute() else "leaves the job's folder"
    inside = "" if url else "a path inside the job's folder (each job has its own) or "
    return (f"output.path={raw} {what}: every job of a multirun would write the same file; give {inside}one with "
            f"${{hydra:job.num}} in it")


def keep_refusal(record: RunRecord, line: str) -> None:
    """A multirun's job refused before its output opened: its record (where its folder holds none yet)
    and the line in REFUSED, so the sweep's readers name it refused with its reason; a folder that
    holds a run's file is left as it was (that file's status speaks)."""
    from hookrun.store.reading import folder_file

    if record.written or folder_file(record.folder) is not None:
        return
    if not (record.folder / ".hydra").exists():
        record.write()
    try:
        (record.folder / REFUSED).write_text(line + "\n", encoding="utf-8")
    except OSError as exc:
        log.warning("could not write %s: %s", record.folder / REFUSED, exc)


def check_jobs(config: DictConfig) -> None:
    """Every job of the sweep `config` (Hydra's, with its hydra node) checked; the refusals printed
    (`hookrun: error: job N (OVERRIDES): LINE`) and the process ended with the first one's exit status."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hookrun.analysis.sweep_plan import planned_jobs

    if OmegaConf.select(config, "hydra.sweep.dir") is None or not GlobalHydra.instance().is_initialized():
        return
    loader = GlobalHydra.instance().config_loader()
    try:
        jobs = planned_jobs(OmegaConf.to_container(config.hydra, resolve=False), OverridesParser.create(config_loader=loader))
    except Exception:  # (a sweep this Hydra cannot expand here: its sweeper says so as it starts)
        return
    swept = sorted({o.partition("=")[0].lstrip("+~") for job in jobs for o in job if sum(o in j for j in jobs) < len(jobs)})
    if swept:  # (its jobs' env: a key that one value of a swept key reads is the other jobs' to leave, as a kind's block says)
        with read_write(config), open_dict(config):  # (each job's config is composed again from these overrides)
            config.hydra.overrides.hydra.append(f"++hydra.job.env_set.{SWEPT}='{' '.join(swept)}'")
    refused: dict[str, list[tuple[int, list[str], HookrunError]]] = {}
    for num, overrides in enumerate(jobs):
        exc = _refusal(loader, config, num, overrides)
        if exc is not None:
            refused.setdefault(str(exc), []).append((num, overrides, exc))
    if not refused:
        return
    from hookrun.output.process import detect

    if detect().rank != 0:  # every rank found the same: rank 0 says it
        sys.exit(next(iter(refused.values()))[0][2].exit_code)
    for line, jobs_refused in refused.items():
        if os.environ.get("HOOKRUN_VERBOSE") == "1":
            traceback.print_exception(jobs_refused[0][2], file=sys.stderr)
        print(f"hookrun: error: {_named(jobs_refused, jobs)}: {line}", file=sys.stderr)
    first = next(iter(refused.values()))[0][2]
    sys.exit(first.exit_code)


def _refusal(loader, config: DictConfig, num: int, overrides: list[str]) -> HookrunError | None:
    """The job's refusal, as its run would make it before building the model; None where it passes, or
    where its config cannot be made here (its run then says what it says)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import env_override

    from hookrun.config import load
    from hookrun.config.schema import replaced
    from hookrun.hooks.spec_check import check_specs
    from hookrun.output import in_run_folder
    from hookrun.runner.prepare import check_alone

    before = HydraConfig.instance().cfg
    try:
        job = loader.load_sweep_config(config, list(overrides))
        with open_dict(job):  # as the basic launcher and run_job set them (${hydra:job.num}, the job's folder)
            job.hydra.job.id = job.hydra.job.num = num
        HydraConfig.instance().set_config(job)
        folder = Path(str(OmegaConf.select(job, "hydra.sweep.dir")), str(OmegaConf.select(job, "hydra.sweep.subdir")))
        with read_write(job.hydra.runtime), open_dict(job.hydra.runtime):
            job.hydra.runtime.output_dir = os.path.abspath(folder)
        HydraConfig.instance().set_config(job)
        task = copy.deepcopy(job)
        with read_write(task), open_dict(task):
            del task["hydra"]
        try:  # (an interpolation only the job's own process fills in, ${oc.env:SLURM_JOB_ID}: its run checks it)
            OmegaConf.to_container(task, resolve=True)
        except Exception:
            return None
        with env_override(job.hydra.job.env_set):  # (as run_job sets it: HOOKRUN_SWEPT)
            typed = load(task)
        path, staging = in_run_folder(typed.output.path, typed.output.staging, folder.resolve())
        check_specs(check_alone(replaced(typed, output=dataclasses.replace(typed.output, path=path, staging=staging))))
    except HookrunError as exc:
        return exc
    except Exception:  # (not hookrun's refusal: the job's own run meets it, as it would have)
        return None
    finally:
        HydraConfig.instance().cfg = before
    return None


def _named(refused: list[tuple[int, list[str], HookrunError]], jobs: list[list[str]]) -> str:
    """'job 1 (params.factor=abc)', 'job 1, 3 (a=1 b=2; a=3 b=2)' by the overrides that differ between
    the sweep's jobs, or 'every job (3)' where the line is each job's."""
    if len(refused) == len(jobs) > 1:
        return f"every job ({len(jobs)})"
    differ = {o.partition("=")[0] for o in {o for job in jobs for o in job} if sum(o in job for job in jobs) < len(jobs)}
    label = lambda overrides: " ".join(o for o in overrides if o.partition("=")[0] in differ) or "its overrides"  # noqa: E731
    return f"job {', '.join(str(num) for num, _, _ in refused)} ({'; '.join(label(o) for _, o, _ in refused)})"
