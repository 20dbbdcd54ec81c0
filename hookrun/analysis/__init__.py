"""Reading back: open_run, open_sweep, statistics and text views of finished (or running) files.
It reads HDF5 with h5py and knows nothing of hooks or the runner: what a kind of run adds is read by
that kind's reader (hookrun/runner/kinds/<kind>/reader.py), registered in kind_readers.py."""

from hookrun.analysis.loader import RowLoader
from hookrun.analysis.remote_run import open_run
from hookrun.analysis.run_reader import CaptureInfo, Run
from hookrun.analysis.stats import block_stats
from hookrun.analysis.sweep import Sweep, Table, open_sweep

__all__ = ["CaptureInfo", "RowLoader", "Run", "Sweep", "Table", "block_stats", "open_run", "open_sweep"]
