"""`python -m hookrun.inspect PATH`: a readable tree of a run's file, or a table of a sweep.

    python -m hookrun.inspect outputs/2026-11-21/10-00-00/captures.h5
    python -m hookrun.inspect outputs/multirun/2026-11-21/10-00-00
    python -m hookrun.inspect --verify outputs/2026-11-21/10-00-00/captures.h5   # every row against its checksum
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hookrun.analysis.opening import open_run
from hookrun.analysis.show import describe_sweep
from hookrun.analysis.sweep import is_sweep, open_sweep
from hookrun.errors import HookrunError
from hookrun.store.digest import verify
from hookrun.store.reading import UrlPath, run_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.inspect", description=__doc__.splitlines()[0])
    p.add_argument("path", help="a capture file, a run folder, a multirun folder, or a cache's URL (s3://...)")
    p.add_argument("--no-stats", action="store_true", help="skip the statistics (faster on big files)")
    p.add_argument("--verify", action="store_true", help="read every row and check it against its checksum; exit 1 on damage")
    a = p.parse_args(argv)
    a.path = run_path(a.path)
    try:
        if a.verify:
            return verify_file(a.path)
        if not isinstance(a.path, UrlPath) and is_sweep(a.path):
            print(describe_sweep(open_sweep(a.path)))
        else:
            with open_run(a.path) as run:
                print(run.summary(stats=not a.no_stats))
    except HookrunError as exc:
        print(f"hookrun.inspect: error: {exc}", file=sys.stderr)
        return 2
    return 0


def verify_file(path: Path | str) -> int:
    """Every capture's rows against their checksums (store/digest.py); 0 when all match, 1 on damage.
    An object-store cache: every part, each fetched and MD5-checked against the manifest, then checked
    against its own checksums; a part that is missing or damaged is named, and the next is checked."""
    with open_run(path) as run:
        name = run.path
        problems: list[str] = []
        checked = unchecked = 0
        for f in run.part_files(problems):
            p, c, u = verify(f)
            prefix = f"{Path(f.filename).name}: " if run.path != Path(f.filename) else ""
            problems.extend(prefix + x for x in p)  # (the same list: a part that cannot be read is named there too)
            checked, unchecked = checked + c, unchecked + u
    for line in problems:
        print(f"hookrun.inspect: damaged: {line}", file=sys.stderr)
    note = f"; {unchecked} without checksums (written without output.checksum=true, or ragged)" if unchecked else ""
    print(f"{name}: {checked} capture(s) checked{note}: {'DAMAGED, ' + str(len(problems)) + ' problem(s)' if problems else 'every row matches its checksum'}")
    return 1 if problems else 0

if __name__ == "__main__":
    sys.exit(main())
