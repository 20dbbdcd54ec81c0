"""Reliability, round 2: one writer per file, failed batches, overflow, early_stop, a second signal, bad input."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import make_cfg
from test_reliability import assert_same_captures, rich_hooks

import hookrun
from hookrun.analysis.sweep import open_sweep
from hookrun.cli.inspect import main as inspect_main
from hookrun.errors import ConfigError, RunError
from hookrun.runner.signals import Interrupted
from hookrun.store.h5store import H5Store
from hookrun.store.lock import OutputLock, lock_path

RECORD_BODY = {"b": {"at": "body", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def toy_cfg(tmp_path: Path, model: str = "toy_models.CountingNet", hooks=None, **over) -> dict:
    cfg = make_cfg(tmp_path, "", hooks or RECORD_BODY, **over)
    cfg["model"] = {"_target_": model}
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    return cfg


# -- 1. one writer per file ---------------------------------------------------------------------
@pytest.mark.parametrize("over", [{"output.overwrite": True}, {"resume": True}])
def test_a_second_writer_is_refused_and_touches_nothing(tmp_path, over):
    cfg = toy_cfg(tmp_path)
    path = hookrun.run(cfg).path
    before = path.read_bytes()
    with OutputLock(path):  # another run holds the file
        with pytest.raises(ConfigError, match=r"another hookrun run \(pid \d+\) is writing .*captures.h5"):
            hookrun.run(toy_cfg(tmp_path, **over))
        assert path.read_bytes() == before
        assert not Path(str(path) + ".resuming").exists()
    assert not lock_path(path).exists()  # removed by its holder
    assert hookrun.run(toy_cfg(tmp_path, **{"output.overwrite": True})).status == "complete"
    assert not lock_path(path).exists()


def run_in_thread(cfg: dict) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go() -> None:
        try:
            out["result"] = hookrun.run(cfg)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc

    thread = threading.Thread(target=go)
    thread.start()
    return thread, out


def test_a_run_starting_while_another_builds_its_model_is_refused(tmp_path):
    from toy_models import BUILDING

    BUILDING.clear()
    thread, first = run_in_thread(toy_cfg(tmp_path, "toy_models.SlowToBuild"))
    assert BUILDING.wait(60)
    with pytest.raises(ConfigError, match="another hookrun run"):
        hookrun.run(toy_cfg(tmp_path, **{"output.overwrite": True}))
    thread.join(60)
    assert first["result"].status == "complete"
    with h5py.File(first["result"].path) as f:
        assert f.attrs["status"] == "complete" and "SlowToBuild" in f.attrs["model_class"]


def test_a_file_that_appears_while_the_model_builds_is_not_replaced(tmp_path):
    from toy_models import BUILDING

    BUILDING.clear()
    thread, first = run_in_thread(toy_cfg(tmp_path, "toy_models.SlowToBuild"))
    assert BUILDING.wait(60)
    (tmp_path / "captures.h5").write_bytes(b"someone else's results")
    thread.join(60)
    assert isinstance(first.get("error"), ConfigError) and "exists" in str(first["error"])
    assert (tmp_path / "captures.h5").read_bytes() == b"someone else's results"


def test_the_file_appears_only_once_it_opens(tmp_path):
    seen = []
    real_replace = os.replace

    def replace(src, dst):  # the moment the file gets its name, it opens with plain h5py
        if str(dst).endswith("captures.h5") and str(src).endswith(".creating"):  # (not a flush's return)
            with h5py.File(src) as f:
                seen.append((f.attrs["status"], f.attrs["steps_complete"], "samples/index" in f))
        return real_replace(src, dst)

    os.replace = replace
    try:
        hookrun.run(toy_cfg(tmp_path))
    finally:
        os.replace = real_replace
    assert seen == [("running", 0, True)]
    assert [p.name for p in tmp_path.iterdir()] == ["captures.h5"]


# -- 3. a failed batch is dropped, then redone -----------------------------------------------
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


# -- 4. overflow -------------------------------------------------------------------------------
BIG = {"big": {"at": "big", "type": "forward", "actions": [{"name": "record", "what": "output", "dtype": "float16"}]}}


def test_check_finite_checks_the_value_as_stored(tmp_path):
    hooks = {"big": {"at": "big", "type": "forward",
                     "actions": [{"name": "record", "what": "output", "dtype": "float16", "check_finite": True}]}}
    with pytest.raises(RunError, match=r"hook 'big' at big: output has \d+ non-finite value\(s\) at step 0 as stored, in float16"):
        hookrun.run(toy_cfg(tmp_path, "toy_models.Amplify", hooks))


def test_overflow_in_the_cast_is_counted_in_the_log_and_the_capture(tmp_path, caplog):
    from toy_models import Amplify, SignedRows

    cfg = toy_cfg(tmp_path, "toy_models.Amplify", BIG)
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(cfg).path
    torch.manual_seed(cfg.get("seed", 0))  # hookrun seeds before building: the same weights
    model = Amplify().eval()
    data = torch.stack([SignedRows()[i][0] for i in range(12)])
    with torch.no_grad(), np.errstate(over="ignore"):
        want = int(np.isinf(model(data).numpy().astype(np.float16)).sum())  # numpy's own cast
    assert want > 0
    with h5py.File(path) as f:
        ds = f["captures/big/big/output"]
        assert f.attrs["status"] == "complete" and ds.attrs["overflow_values"] == want
        assert int(np.isinf(ds[:]).sum()) == want
    assert f"hook 'big' at big: {want} value(s) of output became inf" in caplog.text


# -- 5. early_stop -------------------------------------------------------------------------------
def test_early_stop_refuses_a_module_that_runs_again_after_the_stop_point(tmp_path):
    hooks = {"m": {"at": "m", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = toy_cfg(tmp_path, "toy_models.RepeatWhenNegative", hooks, early_stop=True)
    with pytest.raises(RunError, match=r"early_stop: in batch 1 the forward goes on to a Linear after the stop point"):
        hookrun.run(cfg)
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == "failed" and f.attrs["steps_complete"] == 1


def test_early_stop_refuses_a_batch_that_fires_fewer_calls(tmp_path):
    hooks = {"m": {"at": "m", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "h": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = toy_cfg(tmp_path, "toy_models.RepeatWhenNegative", hooks, early_stop=True)
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    cfg["data"]["batch_size"] = 4
    with pytest.raises(RunError, match=r"early_stop: batch 1 fires hook 'm' at m \(call 1\) where the probe \(the dataset's first sample\) fired hook 'h' at head"):
        hookrun.run(cfg)


# -- 6. a second signal ----------------------------------------------------------------------------
def test_a_second_sigint_while_the_writer_drains_keeps_counts_and_rows_equal(tmp_path, monkeypatch):
    original = H5Store.write

    def slow(self, rec):
        import time

        time.sleep(0.25)
        return original(self, rec)

    monkeypatch.setattr(H5Store, "write", slow)
    hooks = {**RECORD_BODY, "stop": {"at": "body", "type": "forward",
                                     "actions": [{"_target_": "toy_models.interrupt_twice", "_partial_": True, "step": 2, "after": 0.1}]}}
    cfg = toy_cfg(tmp_path, hooks=hooks, **{"data.batch_size": 1})
    with pytest.raises(Interrupted, match="interrupted by SIGINT after") as info:
        hookrun.run(cfg)
    assert info.value.exit_code == 130
    with h5py.File(tmp_path / "captures.h5") as f:
        n = f["samples/index"].shape[0]
        assert f.attrs["status"] == "interrupted"
        assert f.attrs["samples_complete"] == f.attrs["steps_complete"] == n == f["captures/b/body/output"].shape[0]
        assert 1 <= n <= 3


def test_ctrl_c_while_the_model_is_built_says_nothing_was_written(tmp_path):
    with pytest.raises(Interrupted, match="before the output file was created; nothing was written") as info:
        hookrun.run(toy_cfg(tmp_path, "toy_models.InterruptedWhileBuilt"))
    assert info.value.exit_code == 130
    assert list(tmp_path.iterdir()) == []


# -- 8. bad input: one line, no traceback ----------------------------------------------------------
@pytest.mark.parametrize("over, message", [
    ({"output.path": "x" * 300 + ".h5"}, r"output.path: the name 'x+'... is too long \(303 bytes; file systems allow 255 bytes in a name\)"),
    ({"data.batch_size": 2**70}, r"data.batch_size must be at least 1 and at most \d+, got 1180591620717411303424"),
    ({"seed": 2**70}, r"seed: 1180591620717411303424 is out of range; use a whole number from 0 to 18446744073709551615"),
    ({"output.path": "."}, r"output.path: '.*' is a folder; give a file path"),
])
def test_bad_values_get_one_line(tmp_path, over, message):
    over = {k: str(tmp_path / v) if k == "output.path" else v for k, v in over.items()}
    with pytest.raises(ConfigError, match=message):
        hookrun.run(toy_cfg(tmp_path, **over))


def test_a_blocklisted_target_gets_the_whole_sentence(tmp_path):
    cfg = toy_cfg(tmp_path)
    cfg["model"] = {"_target_": "builtins.eval"}
    with pytest.raises(ConfigError, match=r"model: Target 'builtins.eval' is blocklisted because it allows config data "
                                          r"to control executable behavior .* HYDRA_INSTANTIATE_ALLOWLIST_OVERRIDE\.$"):
        hookrun.run(cfg)


def test_inspect_a_file_without_config(tmp_path, capsys):
    with h5py.File(tmp_path / "bare.h5", "w") as f:
        f.attrs["format_version"] = "1"
        f.create_dataset("samples/index", data=np.arange(3))
    assert inspect_main([str(tmp_path / "bare.h5")]) == 0
    assert "status    unknown" in capsys.readouterr().out


def test_sweep_table_shows_an_unreadable_job_and_goes_on(tmp_path):
    for num in ("0", "1"):
        job = tmp_path / num
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- seed={num}\n")
        hookrun.run(toy_cfg(job, seed=int(num)))
    (tmp_path / "0" / "captures.h5").write_bytes(b"not HDF5 at all")
    table = open_sweep(tmp_path).table()
    assert len(table) == 2
    assert table[0]["status"].startswith("unreadable: ") and "not a readable HDF5 file" in table[0]["status"]
    assert table[1]["status"] == "complete" and "b/body/output:mean" in table.columns


def test_a_hook_that_never_fires_is_named_in_the_log_and_the_file(tmp_path, caplog):
    hooks = {**RECORD_BODY, "idle": {"at": "spare", "type": "forward", "actions": ["record"]}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(toy_cfg(tmp_path, "toy_models.WithSpare", hooks)).path
    assert "hook 'idle' never fired: module 'spare' did not run in any batch" in caplog.text
    with h5py.File(path) as f:
        assert f.attrs["hooks_not_fired"] == "idle@spare"


def test_a_module_name_with_a_slash_is_reachable_by_its_label(tmp_path):
    hooks = {"p": {"at": "parts.a/b", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    path = hookrun.run(toy_cfg(tmp_path, "toy_models.WithSpare", hooks)).path
    with hookrun.open_run(path) as run:
        (info,) = run.captures
        assert info.label == "p/parts.a/b/output" and info.path == "/captures/p/parts.a%2Fb/output"
        assert run["p/parts.a/b/output"].shape == (12, 8)
        assert run["parts.a/b", "output"].shape == (12, 8)


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


@pytest.mark.slow
def test_a_second_cli_run_with_overwrite_is_refused_while_the_first_writes(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from conftest import run_cli
    from test_reliability import ENV

    args = ["model=custom", "model._target_=my_pkg.Net", "data=custom", "data.dataset._target_=my_pkg.MyData",
            "+data.dataset.n=8000", "+data.dataset.size=8", "data.batch_size=4", "progress=false", "hydra.run.dir=run",
            "hooks={f: {at: features.0, type: forward, actions: [record, {_target_: toy_models.sleep_action, _partial_: true, seconds: 0.1}]}}"]
    first = subprocess.Popen([sys.executable, "-m", "hookrun", *args], cwd=tmp_path, env={**os.environ, **ENV},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = tmp_path / "run" / "captures.h5"
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = run_cli(*args, "output.overwrite=true", cwd=tmp_path, env=ENV)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert "another hookrun run (pid" in second.stderr and "is writing" in second.stderr
    first.send_signal(signal.SIGINT)  # the first run was never disturbed: it stops cleanly
    _, err = first.communicate(timeout=300)
    assert first.returncode == 130, err[-2000:]
    with h5py.File(path) as f:
        n = f["samples/index"].shape[0]
        assert f.attrs["status"] == "interrupted" and n > 0
        assert f["captures/f/features.0/output"].shape[0] == f.attrs["samples_complete"] == n
