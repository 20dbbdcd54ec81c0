"""A command run as on a disk that fills: the process's file-size limit (RLIMIT_FSIZE) fails a write past it
with EFBIG, as a full disk fails it with ENOSPC, and needs no root (no tmpfs to mount). Tests only.

    proc = limited_run(["-m", "hookrun", ...], cwd=tmp_path, limit=80 << 10)   # every file the run writes: <= 80 KB
    proc = limited_run(["-m", "hookrun", ..., "resume=true"], cwd=tmp_path)    # no limit: room again
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def limited_run(args: list[str], cwd: Path, limit: int | None = None, timeout: int = 300,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """`python ARGS` with this checkout and the helpers on its path, one thread (and `env`), under a file-size limit
    of `limit` bytes (None: none)."""
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (a write past the limit then fails with EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    full = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'helpers'}", "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full,
                          preexec_fn=limited if limit else None)
