"""Reading a whole multirun: one row per job with its overrides, status and capture statistics.

    sweep = open_sweep("outputs/multirun/2026-11-21/10-00-00")
    print(sweep.table())                        # job, overrides, status, per-capture mean/std
    sweep.table().to_pandas()                   # where pandas is installed

Each job of a Hydra sweep has its own folder (`N/`) with `.hydra/overrides.yaml` and its own
capture file; the jobs are read one at a time.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hookrun.analysis.kind_readers import Table, kind_columns, no_values_note
from hookrun.analysis.opening import open_run
from hookrun.analysis.run_reader import Run, block_stats
from hookrun.analysis.sweep_plan import planned, typed_overrides
from hookrun.errors import HookrunError, NotFoundError
from hookrun.store import REFUSED
from hookrun.store.paths import scheme_of
from hookrun.store.reading import UrlPath, empty_sweep, folder_file, job_dirs
from hookrun.text_labels import natural_key


@dataclass
class Job:
    folder: Path
    num: str
    overrides: dict[str, Any]  # typed as Hydra reads them: 0.5 a float, 3 an int, true a bool
    file: Path | UrlPath | None  # a URL where the job wrote its run to an object store
    ran: bool = True  # False: a job the sweep planned (multirun.yaml) that left no folder
    refused: str | None = None  # the line of a job refused before its file opened (its folder's refused.txt)

    @property
    def missing(self) -> str:
        """Why the job has no file to read: it was refused, ran and wrote none, or left no folder."""
        return f"was refused: {self.refused}" if self.refused else "wrote no capture file" if self.ran else "left no folder"

    @property
    def state(self) -> str:
        """A job without a file, as the sweep table says it: `refused: LINE`, `no file` or `not run`."""
        return f"refused: {self.refused}" if self.refused else "no file" if self.ran else "not run"

    def open(self) -> Run:
        if self.file is None:
            raise NotFoundError(f"job {self.num} ({self.folder}) {self.missing}")
        return open_run(self.file)


class Sweep:
    def __init__(self, folder: str | Path) -> None:
        if scheme_of(str(folder)).remote:  # (Path would make s3:// into s3:/)
            raise NotFoundError(f"{str(folder)!r} is an object-store URL; open_sweep reads the sweep folder Hydra wrote "
                                f"on this machine (outputs/multirun/DATE/TIME); open a run in the store with open_run(URL)")
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise NotFoundError(f"no folder {str(self.folder)!r}")
        self.jobs = _find_jobs(self.folder)
        if not self.jobs and (self.folder / "multirun.yaml").is_file():
            raise NotFoundError(empty_sweep(self.folder))
        if not self.jobs:
            raise NotFoundError(f"{str(self.folder)!r} holds no sweep jobs (folders with .hydra/overrides.yaml)")

    @property
    def swept(self) -> list[str]:
        """The override keys whose values differ between jobs."""
        keys = {k for j in self.jobs for k in j.overrides}
        return sorted(k for k in keys if len({repr(j.overrides.get(k)) for j in self.jobs}) > 1)

    def describe(self, stats: bool = True) -> str:
        """The text `python -m hookrun.inspect SWEEP_FOLDER` prints: the jobs and the table (without
        the captures' statistics where `stats` is False: `--no-stats`)."""
        head = f"{self.folder}: {len(self.jobs)} jobs" + (f", swept: {', '.join(self.swept)}" if self.swept else "")
        return head + "\n" + str(self.table(stats=("mean", "std") if stats else (), captures=None if stats else []))

    def table(self, stats: Sequence[str] = ("mean", "std"), captures: Sequence[str] | None = None) -> Table:
        """One row per job: job number, each override, status, `text` (mode=generate: the first
        sample's generated text; texts() has them all), the numbers the file's kind adds (its
        reader's `columns`: a block kind's totals, ...) and `stats` of each capture (none of a kind's
        capture that its kind says holds no value in this run: no column of NaN)."""
        keys = sorted({k for j in self.jobs for k in j.overrides}, key=lambda k: (k not in self.swept, k))
        columns = ["job", *keys, "status"]
        rows = []
        for job in self.jobs:
            row: dict[str, Any] = {"job": job.num, **{k: job.overrides.get(k) for k in keys}}
            if job.file is None:
                row["status"] = job.state
                rows.append(row)
                continue
            try:
                with job.open() as run:
                    row["status"] = run.status
                    if "generated_ids" in run.file["samples"]:
                        row["text"] = run.texts()[0]["text"] if len(run.file["samples/generated_ids"]) else None
                        if "text" not in columns:
                            columns.append("text")
                    for col, value in kind_columns(run.file).items():  # the kind's numbers (its totals)
                        row[col] = value
                        if col not in columns:
                            columns.append(col)
                    for info in sorted(run.captures, key=lambda c: natural_key(c.label)):  # (by depth: h.2 before h.10)
                        if captures is not None and info.label not in captures:
                            continue
                        values = block_stats(run.file[info.path])
                        if stats and not values["count"] and no_values_note(info.label) is not None:
                            continue  # (a kind's capture with nothing in it by design: patching's exact cells of an exact run)
                        for s in stats:
                            col = f"{info.label}:{s}"
                            row[col] = values[s]
                            if col not in columns:
                                columns.append(col)
            except (HookrunError, OSError, KeyError, ValueError) as exc:  # one unreadable job: say so in its row, go on
                row["status"] = f"unreadable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            rows.append(row)
        return Table(columns, rows)

    def texts(self) -> Table:
        """mode=generate: one row per (job, sample): job, the swept overrides, index, prompt, text."""
        rows = []
        for job in self.jobs:
            if job.file is None:
                continue
            with job.open() as run:
                for t in run.texts():
                    rows.append({"job": job.num, **{k: job.overrides.get(k) for k in self.swept},
                                 "index": t["index"], "prompt": t["prompt"], "text": t["text"]})
        return Table(["job", *self.swept, "index", "prompt", "text"], rows)

    def __getattr__(self, name: str) -> Any:
        """A run's reader method asked of the sweep (`sweep.probes()`): where its numbers are instead."""
        job = next((j for j in self.__dict__.get("jobs", []) if j.file is not None), None)
        if not name.startswith("_") and job is not None and _has_method(job, name):
            raise AttributeError(f"a sweep has no {name}(): its jobs' numbers are one table, sweep.table() (one row "
                                 f"per job, a column per number); one job's own: sweep.jobs[0].open().{name}()")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"Sweep({str(self.folder)!r}, jobs={len(self.jobs)}, swept={self.swept})"


def open_sweep(folder: str | Path) -> Sweep:
    """Open a multirun folder (`outputs/multirun/DATE/TIME`) for reading.

    Args:
        folder: the sweep folder, with one job folder per run (0/, 1/, ...).

    Returns:
        Sweep: `jobs` (each with typed `overrides` and `open()`), and `table()`: one row per job
        with its overrides, status and statistics of every capture (`.to_pandas()`).

    Raises:
        NotFoundError: no such folder, or a folder that holds no jobs.
    """
    return Sweep(folder)


def is_sweep(folder: Path) -> bool:
    """A folder of a multirun's jobs (the commands' test): Hydra's multirun.yaml, or job folders named
    by their numbers (0/, 1/, ...); a folder of separate runs (outputs/DATE/TIME) is none (open_sweep
    reads one where that is meant)."""
    if not folder.is_dir():
        return False
    dirs = job_dirs(folder)  # (the folders alone: their overrides are read by open_sweep)
    return bool(dirs) and ((folder / "multirun.yaml").is_file()
                           or all(d.relative_to(folder).parts[0].isdigit() for d in dirs))


def _find_jobs(folder: Path) -> list[Job]:
    """The jobs' folders (`N/`, or deeper where hydra.sweep.subdir nests them: `N/run/`), each with its
    typed overrides and file; with Hydra's multirun.yaml, every job its sweeper planned that left no
    folder (refused, failed before its first batch, or never started) as a job without one, and a
    folder whose overrides it did not plan (an earlier sweep's, left by a smaller sweep run into its
    folder with output.overwrite=true) left out, with a warning."""
    jobs = [Job(d, d.relative_to(folder).as_posix(), typed_overrides(yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())),
                file := folder_file(d) or _named_file(d), refused=None if file else _refusal(d)) for d in job_dirs(folder)]
    plan = [typed_overrides(planned) for planned in planned(folder)]
    if not plan:  # (another sweeper, or no multirun.yaml: the folders alone say what ran)
        return _in_order(jobs)
    left = [_key(o) for o in plan]
    kept, stale = [], []
    for job in jobs:
        (kept if _key(job.overrides) in left else stale).append(job)
        if _key(job.overrides) in left:
            left.remove(_key(job.overrides))
    for num, overrides in enumerate(plan):
        if _key(overrides) in left and not any(j.num.split("/")[0] == str(num) for j in kept):
            left.remove(_key(overrides))
            kept.append(Job(folder / str(num), str(num), overrides, None, ran=False))
    if stale:
        warnings.warn(f"{folder}: job folder(s) {', '.join(j.num for j in _in_order(stale))} hold overrides its "
                      f"multirun.yaml does not plan (an earlier sweep's): left out of the sweep; remove them",
                      UserWarning, stacklevel=3)
    return _in_order(kept)


def ran_jobs(folder: Path) -> int:
    """How many of the sweep's jobs left a folder (a multirun's last line)."""
    return sum(job.ran for job in _find_jobs(folder)) if folder.is_dir() else 0


def _key(overrides: dict[str, Any]) -> str:
    return repr(sorted(overrides.items()))


def _in_order(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: [(len(part), part) for part in j.num.split("/")])


def _refusal(job: Path) -> str | None:
    """The line of a job refused before its file opened (cli/around_hydra.py writes it), or None."""
    try:
        return (job / REFUSED).read_text(encoding="utf-8").strip().splitlines()[0] or None
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def _named_file(job: Path) -> Path | UrlPath | None:
    """A job's file written outside its folder under a name with the job's number in it
    (output.path=../out_${hydra:job.num}.h5), or to an object store (s3://bucket/sweep/${hydra:job.num}/captures.h5):
    its stored config's path, the number put in."""
    try:
        path = str(yaml.safe_load((job / ".hydra" / "config.yaml").read_text())["output"]["path"])
        num = yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["num"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None
    path = path.replace("${hydra:job.num}", str(num))
    if "${" in path:
        return None
    if scheme_of(path).remote:  # (was None: every job of a sweep to s3://... read 'no file')
        return None if _refusal(job) else UrlPath(path.rstrip("/"))
    file = (job / Path(path).expanduser()).resolve()
    return file if file.is_file() else None


def _has_method(job: Job, name: str) -> bool:
    """Whether the job's run has the kind reader method `name` (its kind's reader loaded by the file)."""
    from hookrun.analysis.kind_readers import kind_method

    with job.open() as run:
        return kind_method(run.file, name) is not None
