"""A kind's reader asked for one part of a run (its inspect lines, plot's figures, the report's
sections, a sweep's columns), and what happens when that part raises.

    with isolated_readers() as failed:      # inspect, plot and report (hookrun/cli/__init__.py: run_command)
        ...                                  # a user's reader that raises: its part is left out
    failed                                  # ["the scaled kind's reader failed: KeyError: ... (its lines: my_kinds.reader.lines)"]

A reader from outside hookrun (a user's kind plugin) is isolated inside a command: its part is left
out, the run's common parts (captures, status, config, the other sections) are still shown, drawn
or written, and the command ends with one line naming the plugin's function and a non-zero exit.
Outside a command (a notebook's run.summary()), and for hookrun's own readers everywhere, the
exception is one HookrunError line that stops the command: a bug of hookrun's is never hidden.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_FAILED: list[str] | None = None  # the running command's failures of users' readers (None: not isolated)


@contextlib.contextmanager
def isolated_readers() -> Iterator[list[str]]:
    """Inside: a user's reader that raises is left out and its one line appended to the list yielded."""
    global _FAILED
    outer, _FAILED = _FAILED, []
    try:
        yield _FAILED
    finally:
        _FAILED = outer


def asked(reader: Any, part: str, *args: Any) -> Any:
    """reader.<part>(*args); an exception of a reader's own code is one line naming the kind, the
    part and (for a user's reader) the function: a HookrunError, or, for a user's reader inside
    isolated_readers(), a line kept for the command's end and an empty part."""
    from hookrun.errors import HookrunError

    fn = getattr(reader, part)
    try:
        return fn(*args)
    except HookrunError:
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        module = getattr(fn, "__module__", None) or ""
        if module == "hookrun" or module.startswith("hookrun.") or _FAILED is None:
            raise HookrunError(f"the {reader.kind} kind's reader failed in {part}: {text}") from exc
        where = f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"
        line = f"the {reader.kind} kind's reader failed: {text} (its {part}: {where}; the run's other parts are shown without it)"
        if line not in _FAILED:  # (a part asked once per capture fails once in the command's lines)
            _FAILED.append(line)
        return {} if part == "columns" else []


def unloaded(kind: str, exc: Exception) -> bool:
    """A user's kind whose plugin or reader fails to load (a missing dependency of its package): inside
    a command, its one line kept once for the command's end (True), as a reader that raises; else False."""
    from hookrun.config.kind_names import shipped_names

    if _FAILED is None or kind in shipped_names():
        return False
    line = f"{exc} (the run's other parts are shown without the {kind} kind's)"
    if line not in _FAILED:
        _FAILED.append(line)
    return True
