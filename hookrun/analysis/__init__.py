"""Reading back: open_run, open_sweep, statistics and text views of finished (or running) files.
It reads HDF5 with h5py and knows nothing of hooks or the runner: what a kind of run adds is read by
that kind's reader (hookrun/runner/kinds/<kind>/reader.py), registered in kind_readers.py."""

from typing import TYPE_CHECKING, Any

__all__ = ["CaptureInfo", "RowLoader", "Run", "Sweep", "Table", "block_stats", "open_run", "open_sweep"]

# imported when first used (PEP 562): a module that needs one helper of analysis/ (the runner's
# human_bytes) loads that module alone, not the readers and the report behind open_run
_NAMES = {"RowLoader": "loader", "open_run": "opening", "CaptureInfo": "run_reader", "Run": "run_reader",
          "block_stats": "stats", "Sweep": "sweep", "Table": "sweep", "open_sweep": "sweep"}

if TYPE_CHECKING:
    from hookrun.analysis.loader import RowLoader
    from hookrun.analysis.opening import open_run
    from hookrun.analysis.run_reader import CaptureInfo, Run
    from hookrun.analysis.stats import block_stats
    from hookrun.analysis.sweep import Sweep, Table, open_sweep


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'hookrun.analysis' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"hookrun.analysis.{_NAMES[name]}"), name)
    globals()[name] = value
    return value
