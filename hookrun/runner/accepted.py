"""The moment a run is accepted: its lock is held, every check has passed and its output is open.

    from hookrun.runner.accepted import on_accepted
    with on_accepted(lambda: print("the output is this run's now")):
        hookrun.run(cfg)      # calls it once, just after the output opens; a refused run never does

The CLI keeps Hydra's record of a run (`.hydra/`, `hookrun.log`) until then (cli/run_record.py), so
a run refused for any reason (the file exists, another writer holds it, a bad config) writes
nothing into its run folder. A dry run, and a resume of a complete file, are never accepted: they
write nothing either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_LISTENERS: list[Callable[[], None]] = []


@contextmanager
def on_accepted(listener: Callable[[], None]) -> Iterator[None]:
    """Within: `listener()` is called when a run is accepted (runner/run.py: execute)."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def accepted() -> None:
    """The run's output is open: tell whoever waits (the CLI's run record)."""
    for listener in list(_LISTENERS):
        listener()
