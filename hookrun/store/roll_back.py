"""Taking a failed batch out again: H5Store.write (store/h5store.py) loads this module only where a
batch fails part-way, and gives it the mark it took before the batch (H5Store._mark: each dataset's
rows, the captures and sample columns there were, the checksums pending and numbered, the kind tables').

    mark = store._mark()
    try:
        store._write(rec, chunk_bytes)
    except BaseException:
        roll_back(store, mark)      # new datasets go, the others get their old length
        raise

Afterwards every dataset holds whole batches and the counts agree with the rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hookrun.store.columns import SampleTable
    from hookrun.store.writer import DigestLog


def roll_back(store: Any, mark: dict) -> None:
    """Take out what a failed batch wrote to `store` (an H5Store): new datasets go, the others get their old
    length."""
    try:
        for path in set(store._columns) - mark["columns"]:
            col = store._columns.pop(path)
            for d in (col.index, col.ds):
                if d is not None:
                    del store.file[d.name]
        roll_back_digests(store.digests, mark["pending"])  # a failed batch's digests never reach the file
        for path in set(store._columns) - mark["indexed"]:
            col = store._columns[path]
            if col.index is not None:
                del store.file[col.index.name]
                col.index, col.ds.attrs["index"] = None, ""
        for name, rows in mark["rows"].items():
            if name in store.file and store.file[name].shape[0] != rows:
                store.file[name].resize(rows, axis=0)
        roll_back_table(store.table, mark["table"])
        for name, t in list(store.tables.items()):
            t.roll_back(mark["tables"].get(name, {}))
            if name not in mark["tables"]:  # a table the failed batch made: taken out whole
                del store.tables[name]
    except Exception:  # e.g. the disk is full: the counts still say which rows are whole batches
        pass


def roll_back_table(table: SampleTable, mark: dict) -> None:
    """The /samples group as it was before the batch (SampleTable.mark): new datasets go, the others
    get their old length."""
    for name in set(table.optional) - mark["optional"]:
        del table.file[table.optional.pop(name).name]
    table.tokens = mark["tokens"]
    for name, rows in mark["rows"].items():
        if table.file[name].shape[0] != rows:
            table.file[name].resize(rows, axis=0)


def roll_back_digests(log: DigestLog, mark: tuple[int, int]) -> None:
    """Take out a failed batch's digests (DigestLog.mark), and the numbers it gave: its new datasets are
    deleted, and one that stays (the sample table's) loses its `digest` attribute, to get a number again."""
    del log.pending[mark[0]:]
    for name in [name for name, k in log.ids.items() if k >= mark[1]]:
        del log.ids[name]
        if name in log.file and "digest" in log.file[name].attrs:
            del log.file[name].attrs["digest"]
    log.next_id = mark[1]
