"""The generic mechanism a kind adopts with one registry line each: the store writes the named tables
a kind hands it (store/records.py), resume reads them back, and readers ask the file's kind
(analysis/kind_readers.py). A toy kind's table, checked against the numbers handed in."""

import h5py
import numpy as np
import pytest

import hookrun
from hookrun.analysis.kind_readers import (
    READERS,
    KindReader,
    kind_columns,
    kind_lines,
    readers_of,
    register_reader,
)
from hookrun.output.objects.remote_lock import RemoteLock
from hookrun.store.h5store import H5Store
from hookrun.store.kind_tables import TABLES, KindTable, register_table, tables_in
from hookrun.store.paths import OutputLock, WriterLock
from hookrun.store.records import StepRecord


class ToyWriter:
    """One float per batch under /toy/value, the running sum as an attribute at each flush."""

    def __init__(self, f: h5py.File) -> None:
        self.f, self.total = f, 0.0

    def write(self, step: int, row: float) -> None:
        ds = self.f.get("toy/value") or self.f.create_dataset("toy/value", shape=(0,), maxshape=(None,), dtype="f8")
        ds.resize(ds.shape[0] + 1, axis=0)
        ds[-1] = row
        self.total += row

    def mark(self):
        return {"rows": self.f["toy/value"].shape[0], "total": self.total} if "toy" in self.f else {}

    def roll_back(self, mark) -> None:
        if not mark:
            del self.f["toy"]
            self.total = 0.0
            return
        self.f["toy/value"].resize(mark["rows"], axis=0)
        self.total = mark["total"]

    def flush(self) -> None:
        if "toy" in self.f:
            self.f["toy"].attrs["total"] = self.total


class Failing(ToyWriter):
    def __init__(self) -> None:
        pass

    def write(self, step: int, row: float) -> None:
        raise OSError("disk full")

    def mark(self):
        return {}

    def roll_back(self, mark) -> None:
        pass


def read_toy(f: h5py.File, rows: int | None = None) -> dict[int, float]:
    return dict(enumerate(f["toy/value"][:rows].tolist()))


@pytest.fixture(scope="module", autouse=True)
def toy_kind():
    register_table(KindTable("toy", ToyWriter, read_toy))
    register_reader(KindReader("toy", present=lambda f: "toy" in f, lines=lambda f: [f"toy {f['toy'].attrs['total']}"],
                               columns=lambda f: {"toy_total": float(f["toy"].attrs["total"])},
                               methods={"toy_values": lambda f: f["toy/value"][:]}))
    yield
    TABLES.pop("toy")
    READERS.pop("toy")


def _record(step: int, tables: dict) -> StepRecord:
    return StepRecord(step=step, sample_index=np.arange(2 * step, 2 * step + 2), target=None, path=None, captures=[],
                      tables=tables)


def test_the_store_writes_a_kinds_named_table_and_a_failed_batch_leaves_no_row(tmp_path):
    values = [0.5, 1.25, 2.0]
    path = tmp_path / "toy.h5"
    with H5Store(path, attrs={"kind": "toy"}) as store:
        for step, v in enumerate(values):
            store.write(_record(step, {"toy": v}))
        # a batch whose second table fails after the toy row is appended: both are taken out again
        register_table(KindTable("bad", lambda f: Failing(), read_toy))
        try:
            with pytest.raises(OSError):
                store.write(_record(3, {"toy": 9.0, "bad": 1.0}))
        finally:
            TABLES.pop("bad")
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["toy/value"][:], np.array(values))
        assert f["toy"].attrs["total"] == sum(values)
        assert [t.name for t in tables_in(f)] == ["toy"]
        assert read_toy(f, rows=2) == {0: 0.5, 1: 1.25}  # what resume replays of the first two batches
        assert [r.kind for r in readers_of(f)] == ["toy"]
        assert kind_lines(f) == [f"toy {sum(values)}"] and kind_columns(f) == {"toy_total": sum(values)}
    run = hookrun.open_run(path)
    np.testing.assert_array_equal(run.toy_values(), np.array(values))
    run.close()


def test_a_file_without_the_kind_attribute_is_read_by_what_it_holds(tmp_path):
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("toy/value", data=np.array([3.0]))
        f["toy"].attrs["total"] = 3.0
    with h5py.File(path) as f:
        assert [r.kind for r in readers_of(f)] == ["toy"]
    with h5py.File(path, "a") as f:
        f.attrs["kind"] = "record"  # a file of another kind: the toy reader is not asked
    with h5py.File(path) as f:
        assert readers_of(f) == [] and kind_lines(f) == []


def test_both_locks_are_writer_locks(tmp_path):
    assert isinstance(OutputLock(tmp_path / "x.h5"), WriterLock)
    assert issubclass(RemoteLock, WriterLock)


def test_a_tables_esc_and_carriage_return_print_as_their_escapes():
    """A sweep table's string cell (a swept override's value) printed raw: an ESC cleared the terminal
    ('\\x1b[2J'), a carriage return overwrote the row. Reference: the escapes written out by hand."""
    from hookrun.analysis.kind_readers import Table

    table = Table(columns=["job", "tag\x1b[31m"], rows=[{"job": 0, "tag\x1b[31m": "a\x1b[2Jb\rc\nd"}, {"job": 1, "tag\x1b[31m": None}])
    text = str(table)
    assert not any(c in text for c in "\x1b\r"), repr(text)
    assert text.splitlines()[0].split() == ["job", "tag\\x1b[31m"]
    assert text.splitlines()[2].split() == ["0", "a\\x1b[2Jb\\x0dc\\nd"]
    assert table.rows[0]["tag\x1b[31m"] == "a\x1b[2Jb\rc\nd"  # (the values themselves as they came)
