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
RUN_TYPES: list[type] = []  # open_run's Run, added by run_reader.py where it is defined (RemoteRun adds no name)


def run_type(cls: type) -> type:
    """Decorator: `cls`'s attributes are names a kind's reader may not take (run_reader.py's Run)."""
    RUN_TYPES.append(cls)
    return cls


def taken_names() -> set[str]:
    """Every name `run.NAME` finds before a kind's reader: Run's attributes and what it sets on itself."""
    return {n for cls in RUN_TYPES for n in dir(cls) if not n.startswith("_")} | set(INSTANCE)


def refuse_taken_names(reader: Any) -> None:
    taken = set(taken_names())
    clashes = [(what, n) for what, names in (("method", reader.methods), ("property", reader.properties))
               for n in names if n in taken]
    if clashes:
        said = ", ".join(f"its {what} {n!r} (run.{n} is open_run's own)" for what, n in clashes)
        raise ConfigError(f"the {reader.kind} kind's reader: {said}, so run.NAME would never reach the reader's; "
                          f"name it otherwise in the KindReader's methods= / properties=")
