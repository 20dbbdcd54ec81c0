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
import atexit
import importlib
import importlib.metadata
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
QUICK = False  # parse() saw --quick: run_child's callers pass warm=harness.QUICK (a smoke run's children forked warm)


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
    global QUICK
    QUICK = a.quick
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
def sync() -> None:
    """os.sync() before a timed run, so that it does not pay for another's dirty pages; not under
    --quick, whose figures are never quoted (on a busy machine a sync waits for every other job's writes)."""
    if not QUICK:
        os.sync()


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment, offline for Hugging Face, with the repository and this folder
    first on PYTHONPATH (a child imports this checkout's hookrun and the benchmark modules), plus `extra`."""
    path = os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path, **extra}


def run_child(cmd: list[str], what: str, env: dict | None = None, warm: bool = False,
              preload: tuple[str, ...] = (), imports: tuple[str, ...] | None = None) -> tuple[dict, os.struct_rusage]:
    """Run `cmd` and wait for it: the JSON of its last stdout line, and its own resource usage
    (os.wait4: its peak RSS and CPU time, no other process's). Its output goes to temporary files,
    so a chatty child cannot block on a full pipe; a failure raises with the end of its stderr.
    Callers sync() first where a run must not pay for another's dirty pages.

    `warm` (a --quick run's smoke sizes only, never the full mode's figures): a `python SCRIPT.py
    ARGS` command is forked from a warm process that imported torch, torchvision, transformers and
    hookrun's dependencies (`imports`, None: WARM_IMPORTS; a caller whose children need less names
    less, so the warm process does not pay for what they never use) and `preload` once, instead of
    a fresh Python paying those imports for each child; its peak RSS then counts the pages it
    shares with that process (see warm_child)."""
    if warm and hasattr(os, "fork") and len(cmd) > 1 and cmd[0] == sys.executable and cmd[1].endswith(".py"):
        return warm_child(cmd, what, dict(os.environ) if env is None else env, preload, imports)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"{what} failed:\n{err.read()[-3000:]}")
        out.seek(0)
        return json.loads(out.read().strip().splitlines()[-1]), usage


# -- children forked from a warm process (--quick only) -------------------------------------------
# variables read when the interpreter, glibc's malloc or torch starts: a child whose own differ gets a server of its own
STARTUP = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "MALLOC_", "CUDA", "TORCH", "PYTORCH", "LD_", "NVIDIA",
           "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "HDF5_")
# what hookrun imports from outside torch (not hookrun itself, which each child imports from this checkout)
HOOKRUN_DEPS = ("numpy", "h5py", "omegaconf", "hydra", "hydra.utils")
WARM_IMPORTS = ("torch", "torchvision", "torchvision.models", "transformers", "transformers.models.gpt2.modeling_gpt2",
                *HOOKRUN_DEPS)
VISION_IMPORTS = ("torch", "torchvision", "torchvision.models", *HOOKRUN_DEPS)  # children that run torchvision models only
_servers: dict[tuple, subprocess.Popen] = {}


def warm_child(cmd: list[str], what: str, env: dict, preload: tuple[str, ...] = (),
               imports: tuple[str, ...] | None = None) -> tuple[dict, os.struct_rusage]:
    """run_child's `python SCRIPT.py ARGS`, forked from a server (this file run with --warm-server) that
    imported `imports` (None: WARM_IMPORTS) and `preload` (third-party modules only: the script, hookrun
    and the benchmark modules are imported fresh by each child) with `env`'s start-up variables; one
    server per set of those, `imports` and `preload`. The child runs the script as `python SCRIPT.py` would (runpy, as __main__,
    its folder first on sys.path, then PYTHONPATH's entries); the server os.wait4s it: its exit
    status and its own resource usage (its peak RSS includes the imports' pages it shares with the server)."""
    startup = {k: v for k, v in env.items() if k.startswith(STARTUP) and k not in ("PYTHONPATH", "PYTHONUNBUFFERED")}
    modules = (*(WARM_IMPORTS if imports is None else imports), *preload)
    key = (tuple(sorted(startup.items())), modules)
    server = _servers.get(key)
    if server is None or server.poll() is not None:
        server = subprocess.Popen([sys.executable, __file__, "--warm-server", *modules], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env={k: v for k, v in env.items() if k != "PYTHONPATH"}, bufsize=0)
        _servers[key] = server
        atexit.register(_stop_server, server)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        server.stdin.write((json.dumps({"argv": cmd[1:], "cwd": os.getcwd(), "env": env, "out": out, "err": err}) + "\n").encode())
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"{what}: the warm server ended")
        answer = json.loads(line)
        with open(err, errors="replace") as f:
            stderr = f.read()
        if answer["code"] != 0:
            raise RuntimeError(f"{what} failed:\n{stderr[-3000:]}")
        with open(out) as f:
            return json.loads(f.read().strip().splitlines()[-1]), resource.struct_rusage(answer["usage"])


def _stop_server(server: subprocess.Popen) -> None:
    if not server.stdin.closed:
        server.stdin.close()  # the server ends at the end of its input
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()


def _warm_run(req: dict, base_path: list[str]) -> None:
    """(In the forked child) the script of req["argv"] as `python SCRIPT ARGS` runs it; exits with its status."""
    import io
    import runpy
    import threading
    import traceback

    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            os.dup2(os.open(path, flags, 0o644), fd)
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False)), encoding=old.encoding,
                                      errors=old.errors, line_buffering=name == "stderr")
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        script = os.path.abspath(req["argv"][0])
        extra = [os.path.abspath(p) for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = list(dict.fromkeys([os.path.dirname(script), *extra, *base_path]))
        sys.argv = [req["argv"][0], *req["argv"][1:]]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        threading._shutdown()  # as the interpreter's exit: wait for the run's non-daemon threads
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm_serve(modules: list[str]) -> None:
    """This file run as `--warm-server MODULE...`: import those, then fork one child per request line on stdin."""
    for name in modules:  # no torch op runs here, so fork is safe
        try:
            importlib.import_module(name)
        except ImportError:  # (a child that needs it fails as a fresh process would)
            pass
    extra = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in extra]  # (sys.path[0]: this file's folder)
    for line in sys.stdin.buffer:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _warm_run(req, base_path)
        _, status, usage = os.wait4(pid, 0)
        sys.stdout.buffer.write((json.dumps({"code": os.waitstatus_to_exitcode(status), "usage": list(usage)}) + "\n").encode())
        sys.stdout.buffer.flush()


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
    """`NAME VERSION` for each module: the literal its package's version.py sets, read without importing
    it (hookrun.cli.installed_version: a parent that ran nothing of torch need not import it for the
    header), else its __version__ on import."""
    from hookrun.cli import installed_version

    return [f"{name} {installed_version(name) or importlib.import_module(name).__version__}" for name in modules]


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


if __name__ == "__main__" and sys.argv[1:2] == ["--warm-server"]:
    _warm_serve(sys.argv[2:])
