"""The terminal: the Hydra app (`python -m hookrun`, app.py, with Hydra's errors in one line in
hydra_errors.py), `python -m hookrun.inspect`, `python -m hookrun.plot` (figures.py draws) and
`python -m hookrun.modules`. The one place that knows Hydra's app; it may import everything.

How every `python -m hookrun.X` command ends (here, in the package every command imports): its exit
code, or one line on stderr.

    def main(argv=None) -> int:
        a = parser.parse_args(argv)
        return run_command(lambda: body(a), needs="pip install 'hookrun[plot]'")

A HookrunError is printed as `PROG: error: MESSAGE` and exits 2, with no traceback; so is an
ImportError where the command names the extra that provides it (`needs`); anything else is a bug
and keeps its traceback. The body returns its exit code (None: 0). A user's kind plugin whose
reader raises has its part left out and the rest shown: one line after the output, exit 1
(analysis/reader_failures.py).

Every command's `main` is wrapped in `@ends_quietly`: a reader that closes the pipe early
(`python -m hookrun.inspect RUN | head`) ends the command with exit 141 (128 + SIGPIPE, what a
shell reports for a Unix tool killed by it) and nothing on stderr, never a BrokenPipeError
traceback or Python's "Exception ignored ... BrokenPipeError" at exit.

Where a command is the whole process (`python -m hookrun...`, the `hookrun` script), `exit_process`
runs it: after the command has closed its files, one collection frees what the command left in
reference cycles (a user's data set that refers to itself: its `__del__` runs, as under plain
`main()`), then the heap is frozen (gc.freeze), so the interpreter's last collection does not walk
torch's objects again: that walk was 0.8 s of every process that imports torch and torchvision on
this 2-core machine (benchmarks/process_pair.py, issue 41 item 18); the one collection walks them
once, about 0.16 s. Nothing is skipped: atexit handlers and logging's shutdown run, and objects
freed by their reference count are freed as before; only objects still reachable at exit (module
globals) are left to the OS.

Before that, `exit_process` checks that torch and torchvision belong together, without importing
torchvision (a run of a language model never needs it; importing it costs about as much as torch):
`mismatch()` is None, or "torch 2.13.0+cpu and torchvision 0.28.0+cu128 do not belong together ...".
The two packages' `version.py` files are read as text (milliseconds): torchvision 0.N goes with
torch 2.(N-15), and a CUDA build of torchvision does not load its ops (`torchvision::nms`) beside a
CPU-only torch, nor beside a torch of another CUDA major version. Only where these say the pair
looks wrong is torchvision imported, to see whether its ops load; a pair that loads is left alone.
pip can leave such a pair where one index (PyTorch's CPU wheels) cannot be reached and it takes the
other package from elsewhere; the line names both versions and the command that reinstalls both
from one source.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

from hookrun.errors import HookrunError

F = TypeVar("F", bound=Callable)
CLOSED_PIPE = 141  # 128 + SIGPIPE


def ends_quietly(main: F) -> F:
    """`main`, ending with exit 141 and no traceback where its reader closed stdout (a pipe into
    `head`); stdout is flushed inside, so what Python would flush at exit fails here instead."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            try:
                return main(*args, **kwargs)
            finally:
                sys.stdout.flush()  # (argparse's --help exits through here too)
        except BrokenPipeError:
            try:  # Python flushes stdout again at exit: point it at /dev/null so that flush is quiet
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
                pass
            raise SystemExit(CLOSED_PIPE) from None

    return wrapper  # type: ignore[return-value]


def exit_process(main: Callable[[], int | None]) -> NoReturn:
    """Run `main` as the process's whole work and exit with its code (module docstring: the run's
    garbage is collected, then the heap is frozen; tests call `main` itself, so a test session's heap
    is never frozen). First, a torch and torchvision that do not belong together are one line and
    exit 2 (`mismatch`, below)."""
    global _LATE
    _LATE = []
    try:  # a Ctrl-C outside a run's own handling (imports, the config, Hydra): one line, exit 130
        broken = mismatch()  # torch and torchvision of two builds: one line, not a failed import later
        if broken is not None:
            sys.exit(fail(broken))
        try:
            code = main()
            note_late_signals()
        finally:
            gc.collect()  # what the run left in reference cycles is freed (its __del__ runs) before the heap is frozen
            gc.freeze()
    except KeyboardInterrupt:
        print("hookrun: interrupted by SIGINT", file=sys.stderr)
        code = 130
    for signum in _LATE[:1]:
        print(f"hookrun: {signal.Signals(signum).name} after the run ended; its exit code {code or 0} is kept",
              file=sys.stderr)
    sys.exit(code)


_LATE: list[int] | None = None  # exit_process's: the signals that came once the process's work was done


def note_late_signals() -> None:
    """In exit_process, once the work is done (its run's file closed), Ctrl-C and SIGTERM are noted
    rather than acted on (a second is acted on: a clean-up that hangs can still be stopped): before, the first made the process exit 130 ('interrupted by SIGINT'), the
    second 143 with no word, a complete run looking stopped. A handler someone else installed is left
    alone; outside exit_process (a test's or a notebook's main()) nothing changes."""
    if _LATE is None or threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(s, _late)


def _late(signum: int, frame: object) -> None:
    """The first late signal noted; a second acted on, as it would have been (a clean-up that hangs stops)."""
    if not _LATE:
        _LATE.append(signum)
        return
    _LATE.clear()
    signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    os.kill(os.getpid(), signum)


def description(doc: str | None) -> str:
    """A command's --help description: its docstring's first paragraph as one line (the first line
    alone may stop mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of samples, channels, values)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give one of at least 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give a whole number of at least 1")
    return value


def run_command(body: Callable[[], int | None], prog: str = "hookrun", needs: str | None = None) -> int:
    """body's exit code; a user's kind reader that raised (analysis/reader_failures.py) left its
    part out of what body showed: one line each after it, and exit 1 where body said 0."""
    from hookrun.analysis.reader_failures import isolated_readers

    with isolated_readers() as failed:
        try:
            code = body()
        except HookrunError as exc:
            code = fail(str(exc), prog)
        except ImportError as exc:
            if needs is None:
                raise
            code = fail(f"{exc}; {needs}", prog)
    for line in failed:
        print(f"{prog}: error: {line}", file=sys.stderr)
    return (code or 1) if failed else code or 0


def fail(message: str, prog: str = "hookrun") -> int:
    """Print one error line and give the exit code of a refused command (2)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


REPAIR = ("reinstall both from one source: pip install --force-reinstall torch torchvision (or, CPU-only wheels: "
          "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cpu)")
VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def installed_version(package: str) -> str | None:
    """`package.__version__` read from its version.py, without importing the package; None if absent."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder, "version.py")
        if path.is_file():
            m = VERSION.search(path.read_text(errors="replace"))
            if m:
                return m.group(1)
    return None


def _split(version: str) -> tuple[tuple[int, ...], str]:
    public, _, local = version.partition("+")
    numbers = tuple(int(n) for n in re.findall(r"\d+", public)[:2])
    return numbers, local


def pair_problem(torch_version: str, vision_version: str) -> str | None:
    """Why these versions do not go together, or None where they look like one pair."""
    (t_major, t_minor), t_build = _split(torch_version)
    (v_major, v_minor), v_build = _split(vision_version)
    if t_major == 2 and v_major == 0 and v_minor != t_minor + 15:
        return f"torchvision 0.{v_minor} is built for torch 2.{v_minor - 15}"
    if t_build == "cpu" and v_build.startswith(("cu", "rocm")):
        return "a CUDA build of torchvision beside a CPU-only torch"
    cuda = [re.match(r"cu(\d+?)\d$", b) for b in (t_build, v_build)]
    if all(cuda) and cuda[0].group(1) != cuda[1].group(1):
        return "torch and torchvision built for different CUDA versions"
    return None


def mismatch() -> str | None:
    """One line where torch and torchvision do not belong together (their ops do not load), else None."""
    torch_version, vision_version = installed_version("torch"), installed_version("torchvision")
    if torch_version is None or vision_version is None:
        return None
    why = pair_problem(torch_version, vision_version)
    if why is None:
        return None
    try:  # the pair looks wrong: see whether torchvision's ops load after all
        import torch
        import torchvision.ops  # noqa: F401

        if hasattr(torch.ops.torchvision, "nms"):
            return None
        failure = "operator torchvision::nms does not exist"
    except Exception as exc:  # RuntimeError: operator torchvision::nms does not exist; an ImportError; ...
        failure = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"torch {torch_version} and torchvision {vision_version} do not belong together ({why}; "
            f"torchvision's ops do not load: {failure}); {REPAIR}")
