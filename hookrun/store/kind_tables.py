"""The named tables a kind of run writes beside the captures (KindTable, register_table), one
generic mechanism for every kind:

    register_table(KindTable("mytable", MyTableWriter, read_mytable))   # in the kind's folder
    StepRecord(..., tables={"mytable": row})   # a kind's step hands its rows by the table's name
    store.write(rec)          # H5Store: each named table's writer, made at its first row, appends them
    rows = TABLES["mytable"].read(f, rows=kept)   # resume's replay: the kept batches' rows by step

The store knows no kind: a table's writer comes from this registry, filled by each kind's folder
(hookrun/runner/kinds/<kind>/) as it is imported. The table's name is its group in the file, so the
layout of files written before this mechanism is the same. H5Store loads this module at the first
rows a step hands for a table, resume where it replays them, a kind's folder as it registers its
table: a run without a kind's table (the plain record) never does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import h5py

from hookrun.errors import RunError


class TableWriter(Protocol):
    """One kind's table in one open file: rows appended per batch, rolled back with a failed batch,
    and what is written once per flush (totals, states)."""

    def write(self, step: int, rows: Any) -> None: ...

    def mark(self) -> Any: ...

    def roll_back(self, mark: Any) -> None: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class KindTable:
    name: str  # the table's group in the file, and its key in StepRecord.tables
    writer: Callable[[h5py.File], TableWriter]  # its writer in a new file
    read: Callable[..., dict[int, Any]]  # read(f, rows=N): the first N batches' rows by batch number (resume)


TABLES: dict[str, KindTable] = {}


def register_table(table: KindTable) -> KindTable:
    TABLES[table.name] = table
    return table


def table(name: str) -> KindTable:
    """The registered table `name` (a row handed for a table no kind registered is a bug: RunError)."""
    try:
        return TABLES[name]
    except KeyError:
        raise RunError(f"a step handed rows for the table {name!r}, which no kind registered; "
                       f"registered: {', '.join(TABLES) or 'none'}") from None


def tables_in(f: h5py.File) -> list[KindTable]:
    """The registered tables a file holds (resume replays their rows)."""
    return [t for t in TABLES.values() if t.name in f]
