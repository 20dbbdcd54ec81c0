"""open_run: a local capture file (analysis/run_reader.py) or a cache in an object store (analysis/remote_run.py).

    with open_run("outputs/first") as run: ...            # a run folder, or its captures.h5
    with open_run("s3://bucket/cache/captures.h5") as run: ...
"""

from __future__ import annotations

import os
from pathlib import Path

from hookrun.analysis.remote_run import RemoteRun
from hookrun.analysis.run_reader import Run
from hookrun.store.reading import PartsSource, open_source


def open_run(path: str | os.PathLike, cache_dir: str | Path | None = None) -> Run:
    """Open a run's capture file for reading (nothing is loaded until asked for).

    Args:
        path: a captures.h5 file, or a run folder that holds one; or the URL of a cache in an
            object store (`s3://bucket/prefix/captures.h5`, any fsspec URL: analysis/remote_run.py).
        cache_dir: for a URL, where its parts are fetched to (default $HOOKRUN_CACHE_DIR or
            ~/.cache/hookrun, a folder per URL).

    Returns:
        Run: a context manager with `status`, `config`, `captures`, `run[module, role]` (an h5py
        dataset), `stats`, `iter`, `loader`, `to_xarray`, `texts`, `summary`.

    Raises:
        NotFoundError: no such file. HookrunError: not a readable hookrun file, or a merged view
        whose shard files are missing (HDF5 would read their rows as zeros).
    """
    source = open_source(path, cache_dir)
    return RemoteRun(source) if isinstance(source, PartsSource) else Run(source)
