"""A benchmark script's quick mode, run as a user runs it, for the tests that check every benchmark runs.

    table = quick(tmp_path, "sae_train.py")   # python benchmarks/sae_train.py --quick --markdown FILE
"""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT


def quick(tmp_path, script: str, *args: str, timeout: int = 600) -> str:
    """`python benchmarks/SCRIPT --quick --markdown FILE ARGS` from the repository root, offline, with
    this checkout's hookrun first on the path: it must succeed and print the table it wrote; the table."""
    path = tmp_path / "table.md"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("OMP_NUM_THREADS", None)  # torch's own default, as a user runs it (conftest sets one thread for tests)
    proc = subprocess.run([sys.executable, f"benchmarks/{script}", "--quick", "--markdown", str(path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = path.read_text()
    assert table.strip() in proc.stdout  # the same table on stdout
    return table
