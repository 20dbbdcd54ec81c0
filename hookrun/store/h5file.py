"""Opening an HDF5 file for writing that a kill -9 at any moment leaves readable.

    writable_folder(Path("."), "output.path")       # made if missing, else a ConfigError naming the key
    f, hidden = create_hidden(Path("captures.h5"))   # h5py.File at .captures.h5.<pid>.creating
    ...  # write the skeleton, f.flush()
    os.replace(hidden, "captures.h5")               # the visible name always opens

Three things together: the file appears under its name only once its skeleton is on disk; dirty
metadata stays in memory until an explicit flush; and freed file space is never reused.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import h5py

from hookrun.errors import ConfigError
from hookrun.store.held import HeldWrites

# Space HDF5 frees (an old B-tree node, a moved object header) is never handed out again: the
# metadata of the last flush may still point there, and a kill before the next flush must find it
# intact. The file grows by the freed bytes, a few KiB per capture.
FILE_SPACE = {"fs_strategy": "none"}


def flushing_path(path: Path) -> Path:
    """Where a file stands while HDF5 flushes it (H5Store._aside); left there by a kill in a flush."""
    return path.with_name(path.name + ".flushing")


def wait_for_flush(path: Path, seconds: float = 2.0) -> bool:
    """True once `path` is back from a running flush (a live run's file steps aside for a few
    milliseconds while HDF5 writes); False where it does not come back (killed in a flush) or
    was never aside."""
    deadline = time.monotonic() + seconds
    while flushing_path(path).exists() and time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.01)
    return path.exists()


def writable_folder(folder: Path, key: str) -> None:
    """The folder files will be created in (an output file's, a staging folder of parts), made if
    missing and checked writable; a ConfigError naming the config `key` where it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot create the folder {str(folder)!r}: {exc.strerror}") from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{key}: the folder {str(folder)!r} is not writable")


def create_hidden(path: Path, **kwargs) -> tuple[h5py.File, HeldWrites, Path]:
    """A new, empty HDF5 file under a hidden name beside `path`, to be moved to `path` once its
    skeleton is flushed, and the file object HDF5 writes it through. (The caller holds the
    output's lock: leftovers of a killed run go.)"""
    for old in path.parent.glob(f".{path.name}.*.creating"):
        old.unlink(missing_ok=True)
    hidden = path.with_name(f".{path.name}.{os.getpid()}.creating")
    raw = HeldWrites(hidden)
    try:
        f = h5py.File(raw, "w", **FILE_SPACE, **kwargs)
    except BaseException:
        raw.close()
        raise
    _metadata_only_at_flush(f)
    return f, raw, hidden


def _metadata_only_at_flush(f: h5py.File) -> None:
    """Keep dirty metadata in memory until flush(): then a crash (kill -9) leaves the file as it
    was at the last flush, which plain h5py and h5ls open. (SWMR files, the other way, need
    h5clear after a crash before h5ls or a plain h5py.File can open them.)"""
    cfg = f.id.get_mdc_config()
    cfg.evictions_enabled = False
    cfg.incr_mode = 0  # H5C_incr__off
    cfg.flash_incr_mode = 0  # H5C_flash_incr__off
    cfg.decr_mode = 0  # H5C_decr__off
    f.id.set_mdc_config(cfg)
