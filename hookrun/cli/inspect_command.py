"""`python -m hookrun.inspect PATH`: a readable tree of a run's file, or a table of a sweep.

    python -m hookrun.inspect outputs/2026-11-21/10-00-00/captures.h5
    python -m hookrun.inspect outputs/multirun/2026-11-21/10-00-00
    python -m hookrun.inspect --verify outputs/2026-11-21/10-00-00/captures.h5   # every row against its checksum
    python -m hookrun.inspect --verify --allow-unverified FILE   # a file written with output.checksum=false
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hookrun.analysis.opening import open_run
from hookrun.analysis.sweep import is_sweep, open_sweep
from hookrun.cli import description, ends_quietly, exit_process, run_command
from hookrun.errors import HookrunError
from hookrun.store.live import live_writer
from hookrun.store.reading import UrlPath, run_path
from hookrun.store.verify import Verified, verify


@ends_quietly
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.inspect", description=description(__doc__))
    p.add_argument("path", help="a capture file, a run folder, a multirun folder, or a cache's URL (s3://...)")
    p.add_argument("--no-stats", action="store_true", help="skip the statistics (faster on big files)")
    p.add_argument("--verify", action="store_true", help="read every row and check it against its checksum; exit 1 on damage, "
                   "3 where a dataset has no checksums")
    p.add_argument("--allow-unverified", action="store_true",
                   help="with --verify: exit 0 where datasets without checksums are the only finding")
    a = p.parse_args(argv)
    if a.allow_unverified and not a.verify:  # (it would do nothing: a plain inspect checks no checksum)
        p.error("--allow-unverified goes with --verify; add --verify, or drop it")
    a.path = run_path(a.path)
    return run_command(lambda: _inspect(a), prog="hookrun.inspect")


def _inspect(a: argparse.Namespace) -> int | None:
    sweep = open_sweep(a.path) if not isinstance(a.path, UrlPath) and is_sweep(a.path) else None
    if a.verify:
        return verify_file(a.path, a.allow_unverified) if sweep is None else verify_sweep(sweep, a.allow_unverified)
    if sweep is not None:
        print(sweep.describe(stats=not a.no_stats))
    else:
        with open_run(a.path) as run:
            print(run.summary(stats=not a.no_stats))
    return None


def verify_sweep(sweep: Any, allow_unverified: bool = False) -> int:
    """Every job's file verified in turn (verify_file's lines, each under its job): 1 where any is
    damaged or a job has no file, else 3 where any could not be verified, else 0."""
    codes = []
    for job in sweep.jobs:
        print(f"job {job.num}:")
        if job.file is None:
            print(f"hookrun.inspect: job {job.num} ({job.folder}) {job.missing}: nothing to verify", file=sys.stderr)
            codes.append(1)
            continue
        try:
            codes.append(verify_file(job.file, allow_unverified))
        except HookrunError as exc:  # (a job's file that cannot be opened: said, and the next job checked)
            print(f"hookrun.inspect: job {job.num}: {exc}", file=sys.stderr)
            codes.append(1)
    return 1 if 1 in codes else 3 if 3 in codes else 0


def verify_file(path: Path | str, allow_unverified: bool = False) -> int:
    """Every capture's rows and the sample table against their checksums (store/verify.py): 0 when
    all match, 1 on damage, 3 when a dataset has no checksums (unless `allow_unverified`). An
    object-store cache: every part, each fetched and MD5-checked against the manifest, then checked
    against its own checksums; a part that is missing or damaged is named, and the next is checked."""
    with open_run(path) as run:
        name = run.path
        writer = live_writer(run.path) if isinstance(run.path, Path) else None
        if writer is not None:  # (its flushes move rows and checksums while they are read: a false DAMAGED)
            raise HookrunError(f"{str(run.path)!r} is being written by a running hookrun{f' (pid {writer})' if writer else ''}: "
                               f"--verify checks a file at rest; verify it once the run ends")
        empty = run.attrs.get("samples_complete") == 0 and run.attrs.get("steps_complete") == 0  # (a run failed at batch 0)
        status = run.status
        unreadable: list[str] = []  # parts that cannot be fetched or opened (part_files names them here)
        found = Verified()
        for f in run.part_files(unreadable):
            part = verify(f)
            prefix = f"{Path(f.filename).name}: " if run.path != Path(f.filename) else ""
            part.problems = [prefix + x for x in part.problems]
            found = found + part
    found.problems = unreadable + found.problems
    for line in found.problems:
        print(f"hookrun.inspect: damaged: {line}", file=sys.stderr)
    if empty and not found.problems:
        print(f"{name}: holds no rows (status {status}, 0 batches): nothing to verify")
        return 0
    unchecked = sorted(set(found.unchecked))
    note = f"; {len(unchecked)} without checksums ({', '.join(unchecked[:3])}{', ...' if len(unchecked) > 3 else ''})" if unchecked else ""
    verdict = f"DAMAGED, {len(found.problems)} problem(s)" if found.problems else (
        "every checked row matches its checksum" if found.checked else "NOTHING could be verified")
    print(f"{name}: {len(set(found.checked))} dataset(s) checked{note}: {verdict}")
    if found.problems:
        return 1
    if unchecked and not allow_unverified:
        what = "nothing could be verified" if not found.checked else f"{len(unchecked)} dataset(s) could not be verified"
        print(f"hookrun.inspect: unverified: {what}: {unchecked[0]} has no checksums (written with "
              f"output.checksum=false, or by an older hookrun); pass --allow-unverified to accept that", file=sys.stderr)
        return 3
    return 0

if __name__ == "__main__":
    exit_process(main)
