"""`python -m hookrun.report PATH [--out FILE]`: one self-contained HTML page of a run or a sweep.

    python -m hookrun.report outputs/first                      # outputs/first/report.html
    python -m hookrun.report outputs/multirun/2026-11-21/10-00-00 --out sweep.html

PATH is a capture file, a run folder, an object-store run (`s3://...`, read through open_run) or a
sweep folder (open_sweep). The page (hookrun.analysis.report builds it) inlines its script, its
styles and its data, and opens with no network. By default it is written beside the run as
`report.html` (in the sweep folder for a sweep, in the current folder for a URL); a report of
another run already there is never replaced: this one is named `report.<8 hex digits of the
run's path>.html`. Bad input (not a run, nothing to show, a folder that cannot be written) is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

from hookrun.analysis.opening import open_run
from hookrun.analysis.report import Budget, build_report
from hookrun.analysis.report.page import source_of
from hookrun.analysis.sweep import is_sweep, open_sweep
from hookrun.cli import at_least_one, description, ends_quietly, exit_process, run_command
from hookrun.errors import ConfigError
from hookrun.store.paths import local_only
from hookrun.store.reading import is_remote, run_path


def default_out(path: str) -> Path:
    if is_remote(path):
        return Path.cwd() / "report.html"
    p = Path(path)
    return (p if p.is_dir() else p.parent) / "report.html"


def free_name(out: Path, source: str) -> Path:
    """`out`, or where a report of another run is there already, `report.<hash>.html` beside it."""
    if out.exists() and source_of(out) not in (None, source):
        return out.with_name(f"{out.stem}.{hashlib.blake2b(source.encode(), digest_size=4).hexdigest()}{out.suffix}")
    if out.exists() and source_of(out) is None:
        raise ConfigError(f"--out {out}: a file that is not a hookrun report is there; name another --out")
    return out


def check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out: cannot create the folder {str(folder)!r} ({exc.strerror}); name a writable one") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--out: the folder {str(folder)!r} is not writable; name a writable one with --out FILE")


def write(path: str, out: Path | None, budget: Budget) -> Path:
    if out is not None and out.is_dir():
        raise ConfigError(f"--out {out}: that is a directory; --out names the page's file, e.g. --out {out / 'report.html'}")
    out = out or default_out(path)
    check_writable(out.parent)  # before anything is read
    local = not is_remote(path)
    if local and is_sweep(Path(path)):
        sweep = open_sweep(path)
        report = build_report(sweep)
    else:
        with open_run(path) as run:
            report = build_report(run, budget)
    target = free_name(out, report.data["source"])
    try:
        return report.save(target, overwrite=True)  # (free_name chose it: this run's page, or no file)
    except OSError as exc:
        raise ConfigError(f"--out {target}: cannot write ({exc.strerror})") from None


@ends_quietly
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.report", description=description(__doc__))
    p.add_argument("path", type=lambda t: str(run_path(t)), help="a capture file, a run folder, an object-store URL, or a sweep folder")
    p.add_argument("--out", default=None, help="the HTML file (default: report.html beside the run)")
    p.add_argument("--values", type=at_least_one, default=Budget.values, help="values read for each histogram (a sample beyond)")
    p.add_argument("--samples", type=at_least_one, default=Budget.samples, help="samples shown one by one in each section that draws samples (maps, patterns, ...)")
    p.add_argument("--features", type=at_least_one, default=Budget.features, help="features listed per module in a section that lists them (a dictionary's)")
    a = p.parse_args(argv)
    return run_command(lambda: _report(a), needs="the report needs plotly: pip install 'hookrun[plot]'")


def _report(a: argparse.Namespace) -> None:
    out = None if a.out is None else Path(local_only(a.out, "--out", "hookrun.report"))
    target = write(a.path, out, Budget(values=a.values, samples=a.samples, features=a.features))
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    exit_process(main)
