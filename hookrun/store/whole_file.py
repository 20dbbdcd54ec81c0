"""A file written whole or not at all: under a hidden temporary name beside it, then renamed.

    write_whole(Path("report.html"), lambda tmp: tmp.write_text(html))
    write_whole(Path("figs/fmap.png"), lambda tmp: fig.savefig(tmp, format="png"))

A writer killed part-way leaves at most the hidden `.NAME.PID.tmp`, never a cut-off file under the
final name (a reader, or a browser, would take it for the whole one); an error removes it. The
rename is atomic on one file system (os.replace), and the temporary name is in the same folder.
The next write into that folder removes such leftovers (files of this pattern; the sae kind its own hidden
SAE folder, `.OUT.PID.tmp`, as it writes the next) whose PID is no
process here and which nobody touched for STALE_SECONDS: a writer on another machine sharing the
folder (NFS) has a PID this machine does not know, but its file is being written, so it is kept.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hookrun.store.lock_holder import alive

STALE_SECONDS = 60.0
_LEFTOVER = re.compile(r"^\..+\.(\d+)\.tmp$")


def write_whole(path: Path, write: Callable[[Path], Any]) -> Path:
    """Call `write(tmp)` (it writes the whole file at `tmp`), then rename tmp to `path`; return `path`."""
    path = Path(path)
    remove_leftovers(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def remove_leftovers(folder: Path, folder_of: str | None = None) -> list[Path]:
    """Remove the `.NAME.PID.tmp` files in `folder` that a killed writer left (its PID no live process,
    the file untouched for STALE_SECONDS); return them. A folder that cannot be listed is left alone.
    With `folder_of`, also the hidden folders `.FOLDER_OF.PID.tmp` (the sae kind's SAE folder's)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        match = _LEFTOVER.match(entry.name)
        if not match or int(match.group(1)) == os.getpid() or alive(int(match.group(1))):
            continue
        try:
            whole = entry.is_dir(follow_symlinks=False) and folder_of is not None and entry.name.startswith(f".{folder_of}.")
            if not (whole or entry.is_file(follow_symlinks=False)) or now - entry.stat(follow_symlinks=False).st_mtime < STALE_SECONDS:
                continue
            if whole:
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:  # (gone already, or not ours to remove)
            continue
        removed.append(Path(entry.path))
    return removed
