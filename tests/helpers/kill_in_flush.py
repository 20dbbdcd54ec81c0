"""A run in a child process that dies inside its Nth flush, before HDF5 wrote anything of that flush
(as a kill -9 would): the one copy the crash and resume tests of every kind share.

    out = killed_inside_a_flush(cfg, at_flush=4)     # CompletedProcess; returncode 9
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

SCRIPT = """
import json, os, sys
import h5py
import hookrun
cfg, at_flush = json.loads(sys.argv[1]), int(sys.argv[2])
calls = [0]
real = h5py.File.flush
def flush(self):
    calls[0] += 1
    if calls[0] == at_flush:
        os._exit(9)  # as a kill -9 would: nothing of this flush written
    real(self)
h5py.File.flush = flush
hookrun.run(cfg)
"""


def killed_inside_a_flush(cfg: dict, at_flush: int, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `cfg` (a plain dict) in a child that exits with 9 inside its `at_flush`-th flush."""
    return subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cfg), str(at_flush)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
