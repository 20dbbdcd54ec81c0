"""Reading runs and sweeps after the fact: open_run, open_sweep."""

from hookrun.analysis.run import CaptureInfo, Run, block_stats, open_run
from hookrun.analysis.sweep import Sweep, Table, open_sweep

__all__ = ["CaptureInfo", "Run", "Sweep", "Table", "block_stats", "open_run", "open_sweep"]
