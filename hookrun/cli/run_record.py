"""Hydra's record of a run (`.hydra/config.yaml`, `hydra.yaml`, `overrides.yaml`, `hookrun.log`),
written into the run folder only once the run is accepted (output/__init__.py: on_accepted).

    with held_saves():              # main(): Hydra's run_job keeps its .hydra files here, unwritten
        _app()                      # the task: record = RunRecord.take(folder); run(cfg) under
                                    # on_accepted(record.write); record.discard() if never accepted

Hydra 1.3 writes `.hydra/` and opens the log file before the task starts, so a second run into an
existing folder, refused a moment later (the file exists, another writer holds it, a bad config),
used to rewrite the first run's `.hydra/` and append its error to the first run's log. Here the
three files are held as text and the log's records in memory until the run's output opens; a run
that is refused writes nothing (a folder Hydra made for it and left empty is removed). The files
hold what Hydra would have written, byte for byte. Only Hydra's in-process launchers (a plain
run, `-m` with the basic launcher) go through here; a launcher that runs jobs in other processes
(joblib, submitit) writes the record as Hydra does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hookrun.store import REFUSED

_HELD: list[tuple[Path, str]] = []  # (file, text) of the .hydra files Hydra asked to write
log = logging.getLogger("hookrun")


@contextmanager
def held_saves() -> Iterator[None]:
    """Within: Hydra's `_save_config` (run_job's `.hydra/*.yaml`) is held instead of written."""
    import hydra.core.utils as utils

    original = utils._save_config

    def hold(cfg: Any, filename: str, output_dir: Path) -> None:
        _HELD.append((Path(output_dir) / filename, OmegaConf.to_yaml(cfg)))  # the text Hydra writes

    utils._save_config = hold
    try:
        yield
    finally:
        utils._save_config = original
        _HELD.clear()


class _Pending(logging.Handler):
    """Keeps the records a file handler would have written until the run is accepted."""

    def __init__(self, file: logging.FileHandler) -> None:
        super().__init__(file.level)
        self.file = file
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class RunRecord:
    """One job's record: its held `.hydra` files and its log's records, until `write` or `discard`."""

    def __init__(self, folder: Path, files: list[tuple[Path, str]], pending: list[_Pending], made: list[Path]) -> None:
        self.folder, self.files, self.pending, self.made = folder, files, pending, made
        self.written = False

    @classmethod
    def take(cls, folder: Path) -> RunRecord:
        """The files held since the last job, and the root logger's file handlers swapped for
        pending ones (Hydra opened them in append mode: an empty file it made is removed)."""
        files = list(_HELD)
        _HELD.clear()
        root = logging.getLogger()
        pending, made = [], []
        for handler in list(root.handlers):
            if isinstance(handler, logging.FileHandler):
                handler.close()
                path = Path(handler.baseFilename)
                try:  # (torchrun's ranks share the run folder: another rank may have removed it first)
                    if path.is_file() and path.stat().st_size == 0:
                        path.unlink(missing_ok=True)
                        made.append(path)
                except FileNotFoundError:
                    made.append(path)
                stand_in = _Pending(handler)
                root.removeHandler(handler)
                root.addHandler(stand_in)
                pending.append(stand_in)
        return cls(folder, files, pending, made)

    def write(self) -> None:
        """The run is accepted: write the `.hydra` files and the log (its records so far, then on)."""
        if self.written:
            return
        self.written = True
        (self.folder / REFUSED).unlink(missing_ok=True)  # (an earlier refusal of this job: it runs now)
        root = logging.getLogger()
        for stand_in in self.pending:
            old = stand_in.file
            file = logging.FileHandler(old.baseFilename, mode="a", encoding=old.encoding)
            file.setLevel(old.level)
            file.setFormatter(old.formatter)
            for f in old.filters:
                file.addFilter(f)
            for record in stand_in.records:
                file.handle(record)
            root.removeHandler(stand_in)
            root.addHandler(file)
        for path, text in self.files:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            except OSError as exc:  # the run goes on: its output is open
                log.warning("could not write %s: %s", path, exc)

    def discard(self) -> None:
        """The run was refused (or wrote nothing): forget the record; the folder stays as it was."""
        if self.written:
            return
        root = logging.getLogger()
        for stand_in in self.pending:
            root.removeHandler(stand_in)
        self.pending = []


def remove_empty(folder: Path) -> None:
    """Remove the run folder Hydra made for a refused or dry run, and its parents while they are empty."""
    try:
        while folder != folder.parent and not any(folder.iterdir()) and folder.resolve() != Path.cwd().resolve():
            folder.rmdir()
            folder = folder.parent
    except OSError:
        pass
