"""The schemes a user's package declares: one entry point of the group `hookrun.schemes` naming its
Scheme (`[project.entry-points."hookrun.schemes"] gs = "my_pkg.store:SCHEME"`), which every process
finds (inspect, plot and report of a `gs://` run too, that no `imports:` reaches). store/paths.py's
scheme_of asks here only for a URL that no registered scheme serves.

    declared("gs", Scheme)    # the package's Scheme for gs://, one that refuses in one line, or None
"""

from __future__ import annotations

import functools
from dataclasses import replace
from importlib.metadata import entry_points
from typing import Any

GROUP = "hookrun.schemes"  # the entry-point group a user's package declares its schemes in: NAME = "module:SCHEME"


@functools.cache
def declared(name: str, kind: type) -> Any:
    """The Scheme a package declares for `name://` (an entry point of hookrun.schemes; `kind`: store/paths.py's
    Scheme, which scheme_of hands in), named `name`, for scheme_of to register; None: none does. One that fails
    to load, or is no Scheme, is a scheme whose every use is that one line (its `why`: a path's scheme is asked
    where no error is caught, so the line comes when the run or the reader opens it)."""
    for ep in entry_points(group=GROUP, name=name):
        where = f"{name}:// paths: the entry point {ep.name!r} of {GROUP} ({ep.value})"
        try:
            scheme = ep.load()
        except Exception as exc:  # (its package's own import failed: one line, as a kind's entry point's)
            return kind(name, True, "", "", why=f"{where} fails to load: {type(exc).__name__}: "
                                                f"{(str(exc).splitlines() or [''])[0]}")
        if not isinstance(scheme, kind):
            return kind(name, True, "", "", why=f"{where} is {type(scheme).__name__}, not a "
                                                f"hookrun.store.paths.Scheme")
        return replace(scheme, name=name)  # (the URL's scheme is the entry point's name)
    return None
