"""open_run: any run, read by the reader its path's scheme names (store/paths.py).

    run = open_run("outputs/first/captures.h5")        # a Run (analysis/run_reader.py)
    run = open_run("s3://bucket/cache/captures.h5")     # a RemoteRun (output/objects/remote_run.py)

The scheme opens the source (store/reading.py's RunSource) and wraps it in its reader: this module
asks no question about the path and imports no reader of a scheme (they load when first used).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hookrun.analysis.run_reader import Run
from hookrun.errors import ChangedWhileRead
from hookrun.store.paths import scheme_of


def open_run(path: str | os.PathLike, cache_dir: str | Path | None = None) -> Run:
    """Open a run's capture file for reading (nothing is loaded until asked for).

    Args:
        path: a captures.h5 file, or a run folder that holds one; or the URL of a cache in an
            object store (`s3://bucket/prefix/captures.h5`, any fsspec URL: output/objects/), or of
            any scheme a module registered (store/paths.py).
        cache_dir: for a URL, where its parts are fetched to (default $HOOKRUN_CACHE_DIR or
            ~/.cache/hookrun, a folder per URL).

    Returns:
        Run: a context manager with `status`, `config`, `captures`, `run[module, role]` (an h5py
        dataset), `stats`, `iter`, `loader`, `to_xarray`, `texts`, `summary`.

    Raises:
        NotFoundError: no such file. HookrunError: not a readable hookrun file, or a merged view
        whose shard files are missing (HDF5 would read their rows as zeros). ChangedWhileRead: a
        live run's writer flushed while the file was opened, OPEN_TRIES times in a row (each such
        open is taken again, the file being intact; a read after the open can meet it as well).
    """
    scheme, tries = scheme_of(path), 0
    while True:
        source, tries = None, tries + 1
        try:
            source = scheme.open_source(path, cache_dir)
            return scheme.open_reader(source)
        except ChangedWhileRead:
            if source is not None:
                source.close()
            if tries == OPEN_TRIES:
                raise
            time.sleep(0.01 * 2**tries)  # (a flush takes milliseconds)


OPEN_TRIES = 5
