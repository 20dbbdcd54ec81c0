"""A kind's scratch folder: the rows it keeps on disk past its memory (a probe's spill file, a
similarity run's spooled rows), beside the run's file, removed when the kind closes.

    scratch = Scratch(cfg.output, "probe_rows", rank)   # outputs/run/.probe_rows.captures.h5.rank-00000/
    path = scratch.path / "p000.rows"
    scratch.cleanup()

The folder is beside the run's file (a local output) or in `output.staging` (an object store's
output: the CLI's run folder), never in the system's temporary folder, which is often memory (tmpfs)
and would hold the rows `memory:` keeps out of it. Its name is fixed by the run's file and rank, so
a run killed with SIGKILL, whose clean-up never ran, leaves a folder that the next run of that output
(its `resume=true`, or a new run) removes when it makes its own, or in `prepare_run` where it may
make none (`clear_scratch`): that run holds the output's lock (kinds make their scratch in
`prepare_run`, under it), so no other writer is using the folder. Only
an object-store run without `output.staging` (the Python API's default) has no folder of its own:
its scratch is a fresh folder of the system's temporary folder, as is one made without an output
(`Scratch(None, what)`: an accumulator used on its own).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hookrun.config.schema import OutputConfig
from hookrun.store.paths import scheme_of


class Scratch:
    def __init__(self, output: OutputConfig | None, what: str, rank: int = 0) -> None:
        self._tmp: tempfile.TemporaryDirectory | None = None
        path = scratch_path(output, what, rank)
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"hookrun-{what}-")
            self.path = Path(self._tmp.name)
            return
        self.path = path
        clear_scratch(output, what, rank)  # a killed run's (this run holds the output's lock)
        self.path.mkdir()

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
        else:
            shutil.rmtree(self.path, ignore_errors=True)


def scratch_path(output: OutputConfig | None, what: str, rank: int = 0) -> Path | None:
    """The folder's fixed name for this output and rank; None where the output has no folder of its own."""
    folder = None
    if output is not None:
        remote = scheme_of(output.path).remote
        folder = (Path(output.staging) if output.staging else None) if remote else Path(output.path).parent
    if folder is None or not folder.is_dir():
        return None
    return folder / f".{what}.{Path(str(output.path)).name}.rank-{rank:05d}"


def clear_scratch(output: OutputConfig | None, what: str, rank: int = 0) -> None:
    """Remove a killed run's folder, also where a kind makes none of its own this time (its rows held in
    memory): the caller holds the output's lock."""
    path = scratch_path(output, what, rank)
    if path is not None and path.exists():
        shutil.rmtree(path, ignore_errors=True)
