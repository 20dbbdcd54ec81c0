"""Where a run lives, by the scheme of its path: the one registry of destinations (where a run is
written), sources (where it is read from) and readers (what open_run hands the user). Nothing else
in hookrun asks whether a path is a URL.

    scheme_of("outputs/run/captures.h5").name    # 'file': a local HDF5 file (output/__init__.py)
    scheme_of("s3://bucket/cache/captures.h5")   # 'objects': parts in an object store (output/objects/)
    open_destination(cfg) / open_source(path)    # output/__init__.py and store/reading.py ask here

A scheme names its destination, its source and its reader by import path ("module:callable"),
resolved when first used: `destination(cfg) -> Destination` (output/interface.py's protocol:
writer, lock, resume), `source(path, cache_dir) -> RunSource` (store/reading.py's protocol) and
`reader(source) -> Run` (analysis/run_reader.py's Run or a subclass; analysis/opening.py's
open_run asks it). Adding one, say `gs://` through another client, is one module that calls
`register_scheme(Scheme("gs", ...))` (imported through `imports:` or at the top of a user's script)
and its test; or, from a user's package, one entry point of the group `hookrun.schemes` naming its
Scheme (`gs = "my_pkg.store:SCHEME"`), which every process finds (inspect, plot and report of a
`gs://` run too, that no `imports:` reaches); a URL whose scheme no entry names goes to the object
store (fsspec), as `s3://` does.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass, replace
from typing import Any

LOCAL_PREFIXES = ("", "file", "local")  # a path with one of these (or none) is a local file


@dataclass(frozen=True)
class Scheme:
    name: str  # the URL scheme it serves ("s3"), or "file" for local paths
    remote: bool  # a URL, not a local path: the CLI stages it in the run folder, readers fetch it
    destination: str  # "module:callable": (cfg) -> a Destination
    source: str  # "module:callable": (path, cache_dir) -> a RunSource
    reader: str = "hookrun.analysis.run_reader:Run"  # "module:callable": (source) -> the user's Run (Run: any source)

    def open_destination(self, cfg: Any) -> Any:
        return _resolve(self.destination)(cfg)

    def open_source(self, path: Any, cache_dir: Any = None) -> Any:
        return _resolve(self.source)(path, cache_dir)

    def open_reader(self, source: Any) -> Any:
        return _resolve(self.reader)(source)


LOCAL = Scheme("file", False, "hookrun.output:local_destination", "hookrun.store.reading:local_source",
               "hookrun.analysis.run_reader:Run")
OBJECTS = Scheme("objects", True, "hookrun.output.objects.destination:parts_destination",
                 "hookrun.output.objects.source:parts_source", "hookrun.output.objects.remote_run:RemoteRun")
SCHEMES: dict[str, Scheme] = {"s3": OBJECTS}
GROUP = "hookrun.schemes"  # the entry-point group a user's package declares its schemes in: NAME = "module:SCHEME"


def register_scheme(scheme: Scheme) -> Scheme:
    """Serve the URLs `NAME://...` with `scheme`'s destination and source."""
    SCHEMES[scheme.name.lower()] = scheme
    return scheme


def prefix(path: object) -> str | None:
    """The URL scheme of `path` ("s3"), or None for a local path."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", str(path))
    return m.group(1).lower() if m and m.group(1).lower() not in LOCAL_PREFIXES else None


def local_path(path: object) -> str:
    """A local path as the file system names it: `file:///tmp/run.h5` (or `local://`) -> `/tmp/run.h5`."""
    m = re.match(r"^(?:file|local)://", str(path), re.IGNORECASE)
    return str(path)[m.end():] if m else str(path)


def local_only(path: object, option: str, what: str) -> str:
    """`path` as the file system names it, for an option that writes local files only (a command's --out);
    a URL is one ConfigError line, not a local folder named `s3:` (Path('s3://b/x') is 's3:/b/x')."""
    if scheme_of(path).remote:
        from hookrun.errors import ConfigError

        raise ConfigError(f"{option} {path}: an object-store URL; {what} writes to a local path only: name one (and "
                          f"copy it to the store after)")
    return local_path(path)


def scheme_of(path: object) -> Scheme:
    """The scheme that serves `path`: a registered one, the object store for any other URL, else local."""
    name = prefix(path)
    if name is None:
        return LOCAL
    return SCHEMES.get(name) or declared(name) or OBJECTS


@functools.cache
def declared(name: str) -> Scheme | None:
    """The Scheme a package declares for `name://` (an entry point of hookrun.schemes), registered; None: none
    does. One that fails to load, or is no Scheme, is a scheme whose every use is that one line (a path's
    scheme is asked where no error is caught: the line comes when the run or the reader opens it)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP, name=name):
        where = f"{name}:// paths: the entry point {ep.name!r} of {GROUP} ({ep.value})"
        try:
            scheme = ep.load()
        except Exception as exc:  # (its package's own import failed: one line, as a kind's entry point's)
            return Refused(name, True, "", "", why=f"{where} fails to load: {type(exc).__name__}: "
                                                   f"{(str(exc).splitlines() or [''])[0]}")
        if not isinstance(scheme, Scheme):
            return Refused(name, True, "", "", why=f"{where} is {type(scheme).__name__}, not a "
                                                   f"hookrun.store.schemes.Scheme")
        return register_scheme(replace(scheme, name=name))  # (the URL's scheme is the entry point's name)
    return None


@dataclass(frozen=True)
class Refused(Scheme):
    """A scheme's entry point that cannot serve: opening anything through it is one ConfigError line."""

    why: str = ""

    def refuse(self, *args: Any) -> Any:
        from hookrun.errors import ConfigError

        raise ConfigError(self.why)

    open_destination = open_source = open_reader = refuse


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
