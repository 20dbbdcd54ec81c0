"""A file written whole or not at all: under a hidden temporary name beside it, then renamed.

    write_whole(Path("report.html"), lambda tmp: tmp.write_text(html))
    write_whole(Path("figs/fmap.png"), lambda tmp: fig.savefig(tmp, format="png"))

A writer killed part-way leaves at most the hidden `.NAME.PID.tmp`, never a cut-off file under the
final name (a reader, or a browser, would take it for the whole one); an error removes it. The
rename is atomic on one file system (os.replace), and the temporary name is in the same folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_whole(path: Path, write: Callable[[Path], Any]) -> Path:
    """Call `write(tmp)` (it writes the whole file at `tmp`), then rename tmp to `path`; return `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
