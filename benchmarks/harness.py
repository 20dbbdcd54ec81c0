"""What every benchmark script shares: its options, paired rounds, the ratios, its child processes,
the header lines and the results table.

    from harness import Targets, environment, parse, parser, quick_and_markdown, report
    p = parser(__doc__)
    p.add_argument("--batches", type=int, default=40)
    quick_and_markdown(p, "2 batches: checks that everything runs", "write the results table to this file too")
    a = parse(p, batches=2)                      # under --quick: these sizes
    t = Targets()
    t.add("1. record / no hooks (time)", 1.04, "<= 1.10", True, "2.10 s / 2.02 s")
    print(report("run.py", environment(12.0, "torch 2.5"), t.lines(), markdown=a.markdown))

The scripts run as `python benchmarks/NAME.py`, so this folder is on sys.path and `import harness`
finds this file. Nothing here measures anything by itself: each script keeps its own routes, sizes
and bounds; this module keeps the plumbing they had written out each time.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent


# -- the command line --------------------------------------------------------------------------
def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose --help prints the script's docstring as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def quick_and_markdown(p: argparse.ArgumentParser, quick: str, markdown: str | None = None) -> None:
    """--quick (a smoke run; help `quick`) and --markdown PATH (where the table goes too; help `markdown`)."""
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--markdown", type=Path, help=markdown)


def int_options(p: argparse.ArgumentParser, **defaults: int) -> None:
    """`--NAME N` for each keyword (underscores become dashes), in order, each an int with that default."""
    for name, default in defaults.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)


def parse(p: argparse.ArgumentParser, **quick) -> argparse.Namespace:
    """The parsed command line; under --quick, each keyword of `quick` overrides that option (the smoke run's sizes)."""
    a = p.parse_args()
    unknown = [name for name in quick if not hasattr(a, name)]
    if unknown:
        raise ValueError(f"--quick sets {', '.join(unknown)}, which no option of this script is named; its options: "
                         f"{', '.join(vars(a))}")
    if a.quick:
        for name, value in quick.items():
            setattr(a, name, value)
    return a


def log(msg: str) -> None:
    """A progress line on stderr (stdout carries the table)."""
    print(msg, file=sys.stderr, flush=True)


# -- paired rounds in this process -------------------------------------------------------------
class Rounds(NamedTuple):
    first: dict  # each route's return value from the warm-up call
    wall: dict[str, list[float]]  # per route, per round: wall-clock seconds
    cpu: dict[str, list[float]]  # per route, per round: this process's CPU seconds (every thread)


def paired_rounds(run: dict[str, Callable], rounds: int,
                  shuffle: Callable[[int, list[str]], None] | None = None) -> Rounds:
    """Call every route once (the warm-up: imports, allocator, kernels, the first file), then `rounds`
    rounds of every route once each, timed by the wall clock and by process CPU time. Before each
    round `shuffle(r, order)` may reorder the running order in place (None: the order of `run`)."""
    first = {name: fn() for name, fn in run.items()}
    wall: dict[str, list[float]] = {name: [] for name in run}
    cpu: dict[str, list[float]] = {name: [] for name in run}
    order, width = list(run), max(map(len, run)) + 1
    for r in range(rounds):
        if shuffle:
            shuffle(r, order)
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            run[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            log(f"  round {r + 1}/{rounds} {name:{width}s} {wall[name][-1]:7.3f} s wall {cpu[name][-1]:7.3f} s cpu")
    return Rounds(first, wall, cpu)


def seeded_shuffle(seed: int = 0) -> Callable[[int, list[str]], None]:
    """A `shuffle` for paired_rounds: one random.Random(seed) shuffles the running order before every round."""
    shuffle = random.Random(seed).shuffle
    return lambda r, order: shuffle(order)


def per_round_shuffle(r: int, order: list[str]) -> None:
    """A `shuffle` for paired_rounds: round r shuffles the running order with random.Random(r)."""
    random.Random(r).shuffle(order)


def ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """The median of the per-round ratios num/den (a slow spell of the machine moves both sides of a pair)."""
    return statistics.median(x / y for x, y in zip(times[num], times[den], strict=True))


# -- child processes ---------------------------------------------------------------------------
def child_env(**extra: str) -> dict[str, str]:
    """This process's environment, offline for Hugging Face, with the repository and this folder
    first on PYTHONPATH (a child imports this checkout's hookrun and the benchmark modules), plus `extra`."""
    path = os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path, **extra}


def run_child(cmd: list[str], what: str, env: dict | None = None) -> tuple[dict, os.struct_rusage]:
    """Run `cmd` and wait for it: the JSON of its last stdout line, and its own resource usage
    (os.wait4: its peak RSS and CPU time, no other process's). Its output goes to temporary files,
    so a chatty child cannot block on a full pipe; a failure raises with the end of its stderr.
    Callers os.sync() first where a run must not pay for another's dirty pages."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"{what} failed:\n{err.read()[-3000:]}")
        out.seek(0)
        return json.loads(out.read().strip().splitlines()[-1]), usage


# -- the report --------------------------------------------------------------------------------
def command(script: str, exe: str = "python") -> str:
    """The command line this process was started with, as a reader would type it: `python benchmarks/NAME.py ARGS`."""
    return f"{exe} benchmarks/{script} {' '.join(sys.argv[1:])}".strip()


def versions(*dists: str) -> list[str]:
    """`NAME VERSION` (or `NAME not installed`) for each distribution, from its installed metadata."""
    out = []
    for dist in dists:
        try:
            out.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{dist} not installed")
    return out


def module_versions(*modules: str) -> list[str]:
    """`NAME VERSION` for each module, from its __version__ (importing it)."""
    return [f"{name} {importlib.import_module(name).__version__}" for name in modules]


def environment(seconds: float, *parts: str, threads: str | None = None) -> str:
    """The line under a table's command: `host: processor, N CPUs[, threads], Python X, parts..., date, S s`."""
    where = [f"{platform.node()}: {platform.processor() or platform.machine()}", f"{os.cpu_count()} CPUs"]
    return ", ".join([*where, *([threads] if threads else []), f"Python {platform.python_version()}", *parts,
                      time.strftime("%Y-%m-%d"), f"{seconds:.0f} s"])


class Targets:
    """The rows of a `| target | measured | bound | met | detail |` table."""

    HEAD = ["| target | measured | bound | met | detail |", "|---|---|---|---|---|"]

    def __init__(self) -> None:
        self.rows: list[str] = []

    def add(self, target: str, measured: float | str, bound: str, ok: bool | None, detail: str) -> None:
        """One row: `measured` as given if a string, else to 3 decimals; met is yes, NO, or empty for None."""
        value = measured if isinstance(measured, str) else f"{measured:.3f}"
        self.rows.append(f"| {target} | {value} | {bound} | {'' if ok is None else 'yes' if ok else 'NO'} | {detail} |")

    def lines(self) -> list[str]:
        return [*self.HEAD, *self.rows]


def document(cmd: str, head: str, table: list[str], *after: str) -> str:
    """`cmd` in backticks, the `head` line (machine, versions, sizes), the table's lines, then each
    of `after` as a paragraph of its own; blank lines between, a newline at the end."""
    return "\n".join([f"`{cmd}`", "", head, "", *table, *(line for text in after for line in ("", text)), ""])


def report(script: str, head: str, table: list[str], *after: str, markdown: Path | None = None,
           append: bool = False) -> str:
    """The document of benchmarks/`script` (its command line, `head`, `table`, `after`), saved to `markdown` if given."""
    text = document(command(script), head, table, *after)
    save(text, markdown, append)
    return text


def save(text: str, path: Path | None, append: bool = False) -> None:
    """Write `text` to `path` (its folders made), or with `append` add it after a blank line; None: nothing."""
    if path is None:
        return
    if append:
        with path.open("a") as f:
            f.write("\n" + text.removesuffix("\n") + "\n")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
