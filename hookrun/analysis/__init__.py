"""Reading back: open_run, open_sweep, statistics and text views of finished (or running) files.
It reads HDF5 with h5py and knows nothing of hooks or the runner."""

from hookrun.analysis import edges  # noqa: F401  (registers run.edges() for patching runs)
from hookrun.analysis.loader import RowLoader
from hookrun.analysis.opening import open_run
from hookrun.analysis.run_reader import CaptureInfo, Run
from hookrun.analysis.stats import block_stats
from hookrun.analysis.sweep import Sweep, Table, open_sweep

__all__ = ["CaptureInfo", "RowLoader", "Run", "Sweep", "Table", "block_stats", "open_run", "open_sweep"]
