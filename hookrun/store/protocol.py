"""What the data loop writes to: the one interface of a run's store, whatever holds it.

    from hookrun.store.protocol import RunStore
    def end_attrs(store: RunStore, attrs: dict) -> None: store.set_attrs(attrs)

Two classes satisfy it: H5Store (one HDF5 file, store/h5store.py) and PartedStore (HDF5 parts
uploaded to an object store, store/parts.py). The writer thread (store/writer.py), resume's replay,
the end-of-run report and `record limit=N`'s restore take a RunStore and never ask which it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from hookrun.store.records import StepRecord

Key = tuple[str, str, str, int]  # (hook, module, role, call)


@runtime_checkable
class RunStore(Protocol):
    """A run's store: whole batches in (`write`), counts out, closed with the run's status."""

    path: Path | str  # the file, or the object-store URL (messages name it)
    steps: int  # batches written
    samples: int  # samples written

    def write(self, rec: StepRecord) -> None:
        """One batch: every dataset grows by its rows, or (on an error) none does."""

    def flush(self) -> None:
        """Make what was written readable under the run's name."""

    def rows_by_key(self) -> dict[tuple, int]:
        """Rows written so far of each capture, by (hook, module, role, call)."""

    def overflow_by_key(self) -> dict[tuple, int]:
        """Values that became inf when cast to the record dtype, by capture."""

    def set_attrs(self, attrs: dict) -> None:
        """Root attributes of the end of the run."""

    def close(self, status: str) -> None:
        """Flush, mark `status` (complete, interrupted, failed) and close."""
