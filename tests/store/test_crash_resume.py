"""A failed batch, a kill -9 at any moment, rows damaged on disk, a symlinked output: every file plain
h5py reads agrees with its counts, and resume goes on to the rows a whole run writes. References:
plain h5py and an uninterrupted run of the same config."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import HELPERS, ROOT, make_cfg
from kill_in_flush import killed_inside_a_flush
from test_reliability import assert_same_captures, rich_hooks
from warm_python import python as warm

import hookrun
from hookrun.errors import ConfigError, RunError
from hookrun.output.process import Interrupted
from hookrun.store.h5store import H5Store


def test_a_batch_that_fails_in_the_writer_is_dropped_and_resume_redoes_it(tmp_path, checkpoint, monkeypatch):
    full = hookrun.run(make_cfg(tmp_path / "full", checkpoint, rich_hooks())).path
    original = H5Store._write_capture

    def failing(self, cap, rec, *args):
        if rec.step == 1 and "layer3" in cap.key.path:  # after /samples and earlier captures got the batch
            raise OSError("simulated write failure")
        return original(self, cap, rec, *args)

    monkeypatch.setattr(H5Store, "_write_capture", failing)
    cfg = make_cfg(tmp_path / "part", checkpoint, rich_hooks())
    with pytest.raises(RunError, match="failed at batch 1: OSError: simulated write failure"):
        hookrun.run(cfg)
    with h5py.File(cfg["output"]["path"]) as f:
        assert f.attrs["status"] == "failed" and f.attrs["steps_complete"] == 1
        assert f["samples/index"].shape[0] == f["samples/step"].shape[0] == f.attrs["samples_complete"] == 4
        assert f["captures/fmap/layer1.0/output"].shape[0] == 4
    monkeypatch.setattr(H5Store, "_write_capture", original)
    cfg["resume"] = True
    assert hookrun.run(cfg).status == "complete"
    assert_same_captures(full, Path(cfg["output"]["path"]))


def test_resume_through_a_symlink_keeps_the_link(tmp_path, checkpoint):
    from toy_models import STOP_AT

    full = hookrun.run(make_cfg(tmp_path / "full", checkpoint, rich_hooks(told=True), **{"data.batch_size": 2})).path
    (tmp_path / "store").mkdir()
    link = tmp_path / "captures.h5"
    link.symlink_to(tmp_path / "store" / "real.h5")
    cfg = make_cfg(tmp_path, checkpoint, rich_hooks(told=True), **{"data.batch_size": 2})
    STOP_AT[:] = [3]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    assert link.is_symlink()
    cfg.update(resume=True)
    cfg["output"]["compression"] = "gzip"  # changes no value: resume goes on
    assert hookrun.run(cfg).status == "complete"
    assert link.is_symlink() and link.resolve() == tmp_path / "store" / "real.h5"
    assert_same_captures(full, link)


def _damage_rows(path, name, row):
    """Flip bytes inside the stored rows of a capture (its data, not its header)."""
    with h5py.File(path, "r") as f:
        ds = f[name]
        info = ds.id.get_chunk_info_by_coord((row,) + (0,) * (ds.ndim - 1))
        offset = info.byte_offset + ds.dtype.itemsize * int(np.prod(ds.shape[1:])) * (row % ds.chunks[0])
    with open(path, "r+b") as raw:
        raw.seek(offset)
        raw.write(b"\x7f\x7f\x7f\x7f")


def test_resume_refuses_rows_damaged_on_disk_and_inspect_verify_names_them(tmp_path, checkpoint):
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks, **{"output.checksum": True})
    path = hookrun.run(cfg).path
    verify = ["-m", "hookrun.inspect", "--verify", str(path)]
    ok = warm(verify, cwd=ROOT, timeout=300)
    assert ok.returncode == 0 and "4 dataset(s) checked: every checked row matches its checksum" in ok.stdout, ok.stderr
    # (the capture, /samples/index, step and target)
    _damage_rows(path, "captures/l/layer2/output", 5)
    bad = warm(verify, cwd=ROOT, timeout=300)
    assert bad.returncode == 1, bad.stdout
    assert "damaged: /captures/l/layer2/output: rows 4..7 do not match their checksum" in bad.stderr
    with h5py.File(path, "a") as f:  # as if it had been interrupted after its last batch
        f.attrs["status"] = "interrupted"
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"resume: .*captures/l/layer2/output rows 4\.\.7 \(batch 1\) do not match their checksum"):
        hookrun.run({**cfg, "resume": True})
    assert path.read_bytes() == before  # the damaged file is left as it was, for the user to look at


@pytest.mark.parametrize("name", ["samples/index", "captures/l/layer2/output.index"])
def test_resume_refuses_a_sample_map_damaged_on_disk(tmp_path, checkpoint, name):
    """(Resume copied /samples and a capture's .index as they were: the new file's checksums then vouched for
    damaged rows, and rows went to the wrong samples.) Reference: inspect --verify names the same block."""
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", "limit": 6}]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks, **{"output.checksum": True})
    path = hookrun.run(cfg).path
    with h5py.File(path, "a") as f:  # as if it had been interrupted after its last batch
        f.attrs["status"] = "interrupted"
        assert f[name].shape[0] >= 6
    _damage_rows(path, name, 5)
    verify = warm(["-m", "hookrun.inspect", "--verify", str(path)], cwd=ROOT, timeout=300)
    block = re.search(rf"damaged: /{re.escape(name)}: (rows \d+\.\.\d+) do not match their checksum", verify.stderr)
    assert verify.returncode == 1 and block, verify.stderr
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=rf"resume: .*/{re.escape(name)}: {block[1]} do not match their checksum "
                                          r"\(damaged on disk\): the file was damaged on disk; move it away"):
        hookrun.run({**cfg, "resume": True})
    assert path.read_bytes() == before


@pytest.mark.slow
def test_hundreds_of_kills_leave_files_whose_lengths_agree_with_their_counts(tmp_path):
    """tests/helpers/kill_store.py forks a writer per kill and SIGKILLs it at a random moment of its life;
    every file left is read with plain h5py: every dataset's length equals what the counts say and
    every row equals the writer's (before the fix, 14 of 190 killed files held more rows than
    samples_complete). A kill inside a flush leaves NAME.flushing, checked against the flush before."""
    import json

    out = subprocess.run([sys.executable, str(HELPERS / "kill_store.py"), str(tmp_path), "--kills", "400",
                          "--want", "120", "--batches", "16"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.splitlines()[-1])  # (kills until 120 files were checked: fewer under load
    assert result["checked"] >= 120, result           # leave a file, as a kill comes before it has its name)
    assert result["disagreements"] == [], result["disagreements"][:5]


def _killed_inside_a_flush(cfg, at_flush):
    """Run `cfg` in a child process that dies inside its `at_flush`-th flush, before HDF5 wrote
    anything of that flush."""
    out = killed_inside_a_flush(cfg, at_flush, timeout=300)
    assert out.returncode == 9, out.stderr[-2000:]


def test_a_run_killed_inside_a_flush_leaves_its_file_under_its_name_and_resume_recovers_it(tmp_path, checkpoint):
    """Killed inside a flush, the file stays under its name as the last whole flush (issue 34 item
    10; it stood aside at captures.h5.flushing before). A `.flushing` file an older hookrun left
    is still named by open_run, kept from a new run, and recovered by resume."""
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    ref = hookrun.run(make_cfg(tmp_path / "ref", checkpoint, hooks)).path
    cfg = make_cfg(tmp_path, checkpoint, hooks, **{"output.flush_every": 1})
    _killed_inside_a_flush(cfg, at_flush=4)  # the skeleton, batches 0 and 1 flushed; killed flushing batch 2
    path, aside = tmp_path / "captures.h5", tmp_path / "captures.h5.flushing"
    assert path.exists() and not aside.exists()
    with h5py.File(path, "r") as f, h5py.File(ref) as r:  # plain h5py: the file of batch 1's flush
        assert (int(f.attrs["steps_complete"]), int(f.attrs["samples_complete"])) == (2, 8)
        assert f["samples/index"].shape[0] == f["captures/l/layer2/output"].shape[0] == 8
        np.testing.assert_array_equal(f["captures/l/layer2/output"][:], r["captures/l/layer2/output"][:8])
    path.rename(aside)  # as hookrun 0.2 left a file killed inside a flush
    with pytest.raises(hookrun.errors.NotFoundError, match=r"captures\.h5\.flushing beside it: the run was killed while it flushed; resume=true"):
        hookrun.open_run(path)
    with pytest.raises(ConfigError, match=r"captures\.h5\.flushing.* resume=true recovers its batches, output\.overwrite=true"):
        hookrun.run(cfg)  # a new run does not silently replace what the kill left
    hookrun.run({**cfg, "resume": True})
    assert path.exists() and not aside.exists()
    with h5py.File(path) as f, h5py.File(ref) as r:
        assert f.attrs["status"] == "complete"
        assert f["samples/index"].shape[0] == f.attrs["samples_complete"] == r.attrs["samples_complete"]
        np.testing.assert_array_equal(f["captures/l/layer2/output"][:], r["captures/l/layer2/output"][:])


def _net_cfg(tmp_path: Path, ckpt: Path) -> dict:
    """my_pkg.Net from a checkpoint on device=auto, its head recorded: 12 samples in 3 batches."""
    return {"model": {"_target_": "my_pkg.Net", "width": 4, "checkpoint": str(ckpt)}, "device": "auto", "progress": False,
            "data": {"dataset": {"_target_": "my_pkg.MyData", "n": 12}, "batch_size": 4},
            "hooks": {"h": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
            "output": {"path": str(tmp_path / "captures.h5"), "flush_every": 1}}


def _cut_short(path: Path, **attrs) -> None:
    """A finished file made to look interrupted after its first batch: resume keeps it and runs the others."""
    with h5py.File(path, "a") as f:
        f.attrs.update(status="interrupted", steps_complete=1, **attrs)


def test_resume_refuses_other_weights_or_another_kind_of_device_and_goes_on_with_the_same(tmp_path):
    """A replaced model.checkpoint was resumed into the old file (batch 0 of network A, the rest of B),
    and device=auto on a machine without the old run's GPU resumed on the CPU, both without a word.
    Reference: the head's output of network A in plain PyTorch."""
    import torch

    import my_pkg

    torch.manual_seed(0)
    net, ckpt = my_pkg.Net(4).eval(), tmp_path / "ck.pt"
    torch.save(net.state_dict(), ckpt)
    cfg = _net_cfg(tmp_path, ckpt)
    path = Path(hookrun.run(cfg).path)
    _cut_short(path)
    torch.save({k: v * 1.5 for k, v in net.state_dict().items()}, ckpt)  # another network under the same config
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"^resume: the model's weights differ from those '.*captures\.h5' was written "
                                          r"with \(model_fingerprint [0-9a-f]{32}, now [0-9a-f]{32}\); resume with the same weights"):
        hookrun.run({**cfg, "resume": True})
    assert path.read_bytes() == before
    torch.save(net.state_dict(), ckpt)
    other = "cpu" if torch.cuda.is_available() else "cuda"  # as device=auto resolved it on another machine
    with h5py.File(path, "a") as f:
        f.attrs["device"] = f"{other}:0" if other == "cuda" else other
    with pytest.raises(ConfigError, match=rf"^resume: '.*captures\.h5' was written on {other}(:0)? and this run is on .*; "
                                          rf"resume on {other} \(device={other}\), or start a new run$"):
        hookrun.run({**cfg, "resume": True})
    with h5py.File(path, "a") as f:
        f.attrs["device"] = "cpu" if other == "cuda" else "cuda:0"
    assert hookrun.run({**cfg, "resume": True}).status == "complete"
    with torch.no_grad():
        want = net(torch.stack([my_pkg.MyData(12)[i][0] for i in range(12)])).numpy()
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/h/head/output"][:], want, rtol=1e-5, atol=1e-6)
    _cut_short(path)
    with h5py.File(path, "a") as f:  # a file of a hookrun that wrote no model_fingerprint resumes as it did
        del f.attrs["model_fingerprint"]
    torch.save({k: v * 1.5 for k, v in net.state_dict().items()}, ckpt)
    assert hookrun.run({**cfg, "resume": True}).status == "complete"


def test_resume_without_room_for_the_copy_names_the_file_and_its_kept_batches(tmp_path, monkeypatch):
    """Out of space while the old batches were copied, resume named the copy (captures.h5.resuming, then
    deleted) and its batch count ("stopped before batch 1 ... keeps every batch before it") while
    captures.h5 kept all of its own. Now: free space is checked against the old file first, and a
    copy that still runs out names captures.h5 and its kept batches. Reference: the file's bytes."""
    import shutil
    from collections import namedtuple

    import torch

    import my_pkg

    torch.manual_seed(0)
    ckpt = tmp_path / "ck.pt"
    torch.save(my_pkg.Net(4).state_dict(), ckpt)
    cfg = {**_net_cfg(tmp_path, ckpt), "resume": True}
    path = Path(hookrun.run({**cfg, "resume": False}).path)
    with h5py.File(path, "a") as f:  # interrupted after its third batch: three to copy
        f.attrs.update(status="interrupted", steps_complete=3)
    before, size = path.read_bytes(), path.stat().st_size
    usage, calls = namedtuple("usage", "total used free"), []

    def disk(free_at):
        def usage_of(folder):
            calls.append(folder)
            return usage(1 << 40, 0, free_at(len(calls)))
        return usage_of

    monkeypatch.setattr(shutil, "disk_usage", disk(lambda n: size))  # less than the file and the margin
    with pytest.raises(ConfigError, match=rf"^resume: copying the 3 kept batches of '{path}' needs about \d+ bytes free "
                                          rf"beside it and {size} are; free some space and resume again"):
        hookrun.run(cfg)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["captures.h5", "ck.pt"]
    calls.clear()  # room for the file at first; none from the copy's second batch on (its third check)
    monkeypatch.setattr(shutil, "disk_usage", disk(lambda n: 1 << 30 if n < 3 else 1000))
    with pytest.raises(RunError, match=rf"^resume: no space left on the device to copy the batches of {path} \(1000 bytes "
                                       r"free, batch 1 needs about \d+\); it is as it was, with its 3 batches: free some space"):
        hookrun.run(cfg)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["captures.h5", "ck.pt"]
