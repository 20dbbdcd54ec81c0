"""`python -m hookrun.inspect --verify` (issue 34 item 5): a file without checksums is never passed
as verified, and the sample table (/samples/index, /samples/step) and variable-length rows carry
checksums too. Files are written by the store itself (tests/helpers/kill_store.py's batches); the damage is
done with plain h5py, and what is damaged is known independently of hookrun."""

from __future__ import annotations

import h5py
import numpy as np
import torch
from kill_store import batch
from lock_holder import lock_holder

from hookrun.cli.inspect_command import main
from hookrun.store.h5store import H5Store
from hookrun.store.live import settled
from hookrun.store.records import Capture, CaptureKey


def _write(path, checksum: bool, batches: int = 4, ragged: bool = False):
    with H5Store(path, {"config": "verify test"}, flush_every=1, checksum=checksum) as store:
        for step in range(batches):
            rec = batch(step)
            if ragged:
                g = torch.Generator().manual_seed(100 + step)
                boxes = [torch.randn(int(n), 4, generator=g) for n in torch.randint(0, 5, (4,), generator=g)]
                rec.captures.append(Capture(CaptureKey("b", "det", "forward", "output"), boxes, False, ragged=True))
            store.write(rec)
    return path


def _change(path, name, row, value):
    with h5py.File(path, "r+") as f:
        f[name][row] = value


def test_a_file_without_checksums_is_not_passed_as_verified(tmp_path, capsys):
    path = _write(tmp_path / "plain.h5", checksum=False)
    _change(path, "captures/f/features/output", 5, np.full((16, 8, 8), 7.0, np.float32))
    assert main([str(path), "--verify"]) == 3
    out = capsys.readouterr()
    assert "NOTHING could be verified" in out.out and "every" not in out.out
    assert "unverified: nothing could be verified" in out.err and "--allow-unverified" in out.err
    assert main([str(path), "--verify", "--allow-unverified"]) == 0


def test_a_changed_sample_index_is_found(tmp_path, capsys):
    path = _write(tmp_path / "c.h5", checksum=True)
    assert main([str(path), "--verify"]) == 0
    assert "every checked row matches its checksum" in capsys.readouterr().out
    with h5py.File(path, "r") as f:
        index = f["samples/index"][:]
    assert np.array_equal(index, np.arange(16))  # the writer's own sample ids (kill_store.batch)
    _change(path, "samples/index", 6, 7)  # rows 6 and 7 now both say sample 7
    _change(path, "samples/step", 1, 3)
    assert main([str(path), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "damaged: /samples/index: rows 4..7 do not match their checksum" in err
    assert "damaged: /samples/step: rows 0..3 do not match their checksum" in err


def test_variable_length_rows_carry_checksums(tmp_path, capsys):
    path = _write(tmp_path / "r.h5", checksum=True, ragged=True)
    assert main([str(path), "--verify"]) == 0
    capsys.readouterr()
    with h5py.File(path, "r+") as f:
        ds = f["captures/b/det/output"]
        row = next(i for i in range(ds.shape[0]) if ds[i].size)  # a sample with boxes
        ds[row] = ds[row] + 1
    assert main([str(path), "--verify"]) == 1
    assert "damaged: /captures/b/det/output: rows" in capsys.readouterr().err


def test_the_sample_table_digests_are_those_of_its_rows(tmp_path):
    """Independent of verify: xxh3 of each batch's int64 sample ids, as the /checksums table holds."""
    import xxhash

    path = _write(tmp_path / "d.h5", checksum=True)
    with h5py.File(path, "r") as f:
        k = int(f["samples/index"].attrs["digest"].rsplit(":", 1)[1])
        table = f["/checksums"][:]
        rows = table[table[:, 0] == k]
        want = [xxhash.xxh3_64_intdigest(np.arange(s * 4, s * 4 + 4, dtype=np.int64).tobytes()) for s in range(4)]
        assert rows[:, 1].tolist() == [4, 8, 12, 16] and rows[:, 2].tolist() == want


def test_a_file_its_run_is_writing_is_not_verified_and_not_called_damaged(tmp_path, capsys):
    """A live run's flushes move rows and the /checksums table while --verify reads them: a run of the
    resnet experiment polled so was DAMAGED in 29 of 62 verifies ("rows 432..447 have no checksum").
    While another process holds the file's lock, --verify says so in one line (exit 2) and reads no row;
    once it is released, the same file verifies."""
    path = _write(tmp_path / "live.h5", checksum=True)
    with lock_holder(path) as pid:
        assert main([str(path), "--verify"]) == 2
    out = capsys.readouterr()
    assert out.err.strip() == (f"hookrun.inspect: error: {str(path)!r} is being written by a running hookrun (pid {pid}): "
                               f"--verify checks a file at rest; verify it once the run ends")
    assert "DAMAGED" not in out.out + out.err
    assert main([str(path), "--verify"]) == 0


def test_a_run_that_failed_before_its_first_batch_has_nothing_to_verify(tmp_path, capsys):
    """It said "NOTHING could be verified ... (written with output.checksum=false, or by an older hookrun)",
    exit 3, for a file written with checksums that holds no row. Reference: plain h5py's row count."""
    import pytest
    from toy_runs import toy_cfg

    import hookrun
    from hookrun.errors import RunError

    collate = {"_target_": "builtins.sum", "_partial_": True}  # (fails on the first batch's items, after the file opens)
    with pytest.raises(RunError, match=r"data.collate failed on the samples \[0, 1, 2, 3\]"):
        hookrun.run(toy_cfg(tmp_path, **{"data.collate": collate, "output.checksum": True}))
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == "failed" and f["samples/index"].shape == (0,)
    assert main([str(tmp_path / "captures.h5"), "--verify"]) == 0
    assert "holds no rows (status failed, 0 batches): nothing to verify" in capsys.readouterr().out


def test_allow_unverified_without_verify_is_refused(tmp_path, capsys):
    """It was accepted and did nothing."""
    import pytest

    _write(tmp_path / "c.h5", checksum=False)
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "c.h5"), "--allow-unverified"])
    assert info.value.code == 2 and "--allow-unverified goes with --verify; add --verify, or drop it" in capsys.readouterr().err


def test_rows_or_a_capture_lost_from_a_file_at_rest_are_named(tmp_path, capsys):
    """A capture cut short (a whole batch, or part of one) or deleted passed: /checksums entries past a
    dataset's end were skipped as 'written after the last flush', and only datasets still in the file
    were checked. The store writes the table with the rows at each flush, so in a file at rest they
    are rows lost. Reference: the lengths and `digest` numbers plain h5py reads before the damage."""
    path = _write(tmp_path / "c.h5", checksum=True)
    with h5py.File(path, "r") as f:
        assert f["captures/f/features/output"].shape[0] == 16 and f.attrs["status"] == "complete"
        k = int(f["captures/m/features/output"].attrs["digest"].rsplit(":", 1)[1])
        steps = int(f["captures/m/features/output"].shape[0])
    for rows, want in ((12, "rows 12..15 are missing: its checksums cover 16 rows, the dataset holds 12"),
                       (14, "rows 14..15 are missing: its checksums cover 16 rows, the dataset holds 14; "
                            "rows 12..13, the start of that batch, cannot be checked")):
        cut = tmp_path / f"cut{rows}.h5"
        cut.write_bytes(path.read_bytes())
        with h5py.File(cut, "r+") as f:
            f["captures/f/features/output"].resize(rows, axis=0)
        assert main([str(cut), "--verify"]) == 1
        err = capsys.readouterr().err
        assert f"damaged: /captures/f/features/output: {want}" in err and "have no checksum" not in err
    with h5py.File(path, "r+") as f:
        del f["captures/m/features/output"]
    assert main([str(path), "--verify"]) == 1
    out = capsys.readouterr()
    assert f"damaged: /checksums: number {k} ({steps} batch(es), rows 0..{steps - 1}) belongs to no dataset" in out.err
    assert "DAMAGED" in out.out


def test_a_killed_or_interrupted_file_still_verifies(tmp_path, capsys):
    """The other side: a run killed between flushes (its last batch's checksums never reached the
    file) and one closed as interrupted hold whole flushes, and verify clean."""
    import os

    killed = tmp_path / "killed.h5"
    pid = os.fork()
    if pid == 0:  # the writer: 3 batches, flushed after the 1st and 2nd, then killed before any close
        try:
            store = H5Store(killed, {"config": "verify test"}, flush_every=2, checksum=True)
            for step in range(3):
                store.write(batch(step))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    settled(killed)  # (the killed writer's flush helper holds the file's lock until it has applied its last message)
    with h5py.File(killed, "r") as f:
        assert f.attrs["status"] == "running" and f["samples/index"].shape == (8,)
    assert main([str(killed), "--verify"]) == 0
    interrupted = tmp_path / "interrupted.h5"
    store = H5Store(interrupted, {"config": "verify test"}, flush_every=3, checksum=True)
    for step in range(2):
        store.write(batch(step))
    store.close("interrupted")
    assert main([str(interrupted), "--verify"]) == 0
    assert "DAMAGED" not in capsys.readouterr().out


def _mapped(path, batches: int = 4, fail: int | None = None):
    """kill_store's batches (a target, a token map, a capture with its own `.index`) with a path and a
    data.store key per sample (with `fail`: from batch `fail` on, which first arrives with a bad capture
    shape and is taken out)."""
    with H5Store(path, {"config": "verify test"}, flush_every=1, checksum=True) as store:
        for step in range(batches):
            rec = batch(step)
            if fail is None or step >= fail:
                rec.path = [f"img/é{i}.png" for i in rec.sample_index]
                rec.samples = {"input_ids": np.stack([rec.sample_index * 7 + j for j in range(3)], axis=1)}
            if step == fail:
                bad = batch(step)
                bad.path, bad.samples = rec.path, rec.samples
                bad.captures[0] = Capture(bad.captures[0].key, torch.zeros(4, 3), False)
                try:
                    store.write(bad)
                except Exception:
                    pass
            store.write(rec)
    return path


def test_what_maps_rows_to_samples_carries_checksums(tmp_path, capsys):
    """`<role>.index`, /samples/target, the token map, /samples/path and data.store keys were neither
    checked nor listed: changing which sample a row is verified clean. Reference: xxh3 of the int64
    values the batches hold (kill_store.batch), and the damage done with plain h5py."""
    import xxhash

    path = _mapped(tmp_path / "m.h5")
    assert main([str(path), "--verify"]) == 0
    out = capsys.readouterr().out
    with h5py.File(path, "r") as f:
        table = f["/checksums"][:]
        names = ["captures/h/head/output.index", "samples/target", "samples/token_sample", "samples/token_position",
                 "samples/path", "samples/input_ids", "samples/index", "samples/step"]
        assert f["captures/h/head/output"].attrs["index"] == "output.index"
        ks = {name: int(f[name].attrs["digest"].rsplit(":", 1)[1]) for name in names}
        assert len(set(ks.values())) == len(names)
        for name in ("captures/h/head/output.index", "samples/target"):
            rows = table[table[:, 0] == ks[name]]
            want = [xxhash.xxh3_64_intdigest((np.arange(s * 4, s * 4 + 4) % (10 if "target" in name else 10**9))
                                             .astype(f[name].dtype).tobytes()) for s in range(4)]
            assert rows[:, 1].tolist() == [4, 8, 12, 16] and rows[:, 2].tolist() == want
    assert f"{len(names) + 4} dataset(s) checked: every checked row matches" in out  # + the 4 captures
    damage = {"captures/h/head/output.index": (5, 9), "samples/target": (0, 3), "samples/token_position": (13, 2),
              "samples/input_ids": (9, [1, 2, 3]), "samples/path": (2, "img/other.png")}
    for name, (row, value) in damage.items():
        _change(path, name, row, value)
    assert main([str(path), "--verify"]) == 1
    err = capsys.readouterr().err
    for name, rows in (("captures/h/head/output.index", "4..7"), ("samples/target", "0..3"),
                       ("samples/token_position", "12..23"), ("samples/input_ids", "8..11"), ("samples/path", "0..3")):
        assert f"damaged: /{name}: rows {rows} do not match their checksum" in err, err


def test_an_older_file_without_the_map_checksums_is_unverified_not_damaged(tmp_path, capsys):
    """A file written before the `.index` and /samples datasets had checksums: those are listed as
    unchecked (exit 3, --allow-unverified: 0), never as damaged. Made here by taking their `digest`
    attributes and /checksums rows out with plain h5py, as the earlier writer left them."""
    path = _mapped(tmp_path / "old.h5")
    with h5py.File(path, "r+") as f:
        newer = [f["captures/h/head/output.index"]] + [f["samples"][k] for k in f["samples"] if k not in ("index", "step")]
        ks = [int(ds.attrs["digest"].rsplit(":", 1)[1]) for ds in newer]
        for ds in newer:
            del ds.attrs["digest"]
        table = f["/checksums"][:]
        del f["/checksums"]
        f["/checksums"] = table[~np.isin(table[:, 0], ks)]
    assert main([str(path), "--verify"]) == 3
    out = capsys.readouterr()
    assert "DAMAGED" not in out.out and "damaged" not in out.err
    assert f"{len(newer)} without checksums" in out.out and "could not be verified" in out.err
    assert main([str(path), "--verify", "--allow-unverified"]) == 0


def test_a_batch_taken_out_leaves_no_checksum_number_behind(tmp_path, capsys):
    """A failed batch that created datasets (/samples/path and input_ids, first given at batch 2) is
    taken out with the numbers it gave them: the next try makes them again, backfilled, with numbers
    of their own, and the file verifies clean (a number left behind read as a dataset missing)."""
    path = _mapped(tmp_path / "f.h5", fail=2)
    with h5py.File(path, "r") as f:
        tags = [f[n].attrs["digest"] for n in ("samples/path", "samples/input_ids", "captures/f/features/output")]
        assert len(set(tags)) == 3 and f["samples/path"].shape == (16,) and f["samples/path"][0] == b""
        datasets = [f["samples"][k] for k in f["samples"]] + [f[p] for p in (
            "captures/f/features/output", "captures/m/features/output", "captures/t/block/output",
            "captures/h/head/output", "captures/h/head/output.index")]
        numbers = {int(ds.attrs["digest"].rsplit(":", 1)[1]) for ds in datasets}
        assert set(np.unique(f["/checksums"][:, 0]).tolist()) == numbers and len(numbers) == len(datasets)
    assert main([str(path), "--verify"]) == 0
    assert "every checked row matches" in capsys.readouterr().out
