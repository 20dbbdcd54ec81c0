"""A kind's reader whose method or property is named like an attribute of open_run's Run (`run.config`,
`run.captures`, `run.close`, ...): Python finds Run's own first, so `run.NAME` never reached the reader's
and returned Run's (a user's `methods={"config": ...}` read as the run's config, without a word). One line
naming the names, when the reader is loaded (analysis/kind_readers.py's reader_for).

    refuse_taken_names(reader)   # ConfigError: "the scaled kind's reader: its method 'config' is ..."
"""

from __future__ import annotations

from typing import Any

from hookrun.errors import ConfigError

INSTANCE = ("source", "path", "captures", "parts")  # what Run.__init__ (and RemoteRun's) set on the object


def taken_names() -> set[str]:
    """Every name `run.NAME` finds before a kind's reader: Run's (and RemoteRun's) attributes."""
    from hookrun.analysis.run_reader import Run
    from hookrun.output.objects.remote_run import RemoteRun

    return {n for n in (*dir(Run), *dir(RemoteRun)) if not n.startswith("_")} | set(INSTANCE)


def refuse_taken_names(reader: Any) -> None:
    taken = set(taken_names())
    clashes = [(what, n) for what, names in (("method", reader.methods), ("property", reader.properties))
               for n in names if n in taken]
    if clashes:
        said = ", ".join(f"its {what} {n!r} (run.{n} is open_run's own)" for what, n in clashes)
        raise ConfigError(f"the {reader.kind} kind's reader: {said}, so run.NAME would never reach the reader's; "
                          f"name it otherwise in the KindReader's methods= / properties=")
