"""How `python -m hookrun` (cli/app.py) ends a run it refuses or that fails, loaded only then: one line
`hookrun: error: ...` on stderr and in the run's log, and the error's exit status, no traceback
(HYDRA_FULL_ERROR=1 or --verbose: the traceback first, then the same line and status).

    give_up(ConfigError("output.path=...: ..."))   # prints the line, keeps it in the log, exits 2
    failed(exc, overrides, compose_groups, conf, task_started, full_error)   # an exception out of Hydra's run

Anything that is neither hookrun's error nor one of Hydra's composition (hydra_errors.py words those) is
a bug and keeps its traceback: `failed` returns, and the app raises it again.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from hookrun.errors import ConfigError, HookrunError
from hookrun.output.process import Interrupted, detect

log = logging.getLogger("hookrun")


def give_up(exc: HookrunError, cause_traceback: bool = False) -> NoReturn:
    """One line on stderr (and in the run's log), the exit status, no traceback; `cause_traceback`: the
    traceback of the error behind the line (the model's own), where it has one, printed first."""
    if getattr(exc, "every_rank", False) and detect().rank != 0:
        sys.exit(exc.exit_code)  # every rank found the same; rank 0 says it
    word = "" if isinstance(exc, Interrupted) else "error: "
    if cause_traceback and exc.__cause__ is not None:  # the model's own error behind the one line
        traceback.print_exception(exc.__cause__, file=sys.stderr)
    _log_to_file(f"{word}{exc}")
    print(f"hookrun: {word}{exc}", file=sys.stderr)
    sys.exit(exc.exit_code)


def _log_to_file(message: str) -> None:
    """Keep the error in the run's log file without printing it a second time on the terminal
    (Hydra's job logging sends records to the console as well as to the file)."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (message,), None)
    for handler in logging.getLogger().handlers + log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def failed(exc: Exception, overrides: list[str], compose_groups: Callable[[list[str]], Any], conf: str,
           task_started: bool, full_error: bool) -> None:
    """The app's end for an exception out of Hydra's run (called in its `except`): a HookrunError (from a
    launcher's worker process, which inherits HYDRA_FULL_ERROR) or Hydra's error as one line
    (hydra_errors.failure_line), its exit status; returns only for any other exception, which the app
    raises again. `full_error`: the traceback asked for, then the one line and its exit status as without it."""
    if full_error:
        traceback.print_exc()
    if isinstance(exc, HookrunError):
        give_up(exc)
    from hookrun.cli.hydra_errors import failure_line  # (loaded only here)

    line = failure_line(exc, overrides, compose_groups, conf, task_started)
    if line is None:
        if full_error:
            sys.exit(1)
        return
    give_up(ConfigError(line))
