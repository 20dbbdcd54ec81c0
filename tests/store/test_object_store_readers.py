"""Every reader takes an object-store run, and one writer per URL (issues 31 and 34), against moto's
S3 server on 127.0.0.1 (the fixtures of tests/helpers/moto_s3.py). The references are independent: the
same run written to a local file and read with plain h5py, numpy and the model's own layers."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch
from moto_s3 import BUCKET, RUNNER, URL, N, assert_same_as_local, cfg, local_run, moto_bucket

import hookrun
from hookrun.errors import ConfigError

PREFIX = "cache/captures.h5"
s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket: the same fixture


def reference_model() -> torch.nn.Sequential:
    """The model cfg() builds: seed 3, then the same layers."""
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def patched_cfg(tmp_path, source: str, name: str) -> dict:
    c = cfg(str(tmp_path / name), tmp_path)
    c["data"]["dataset"]["seed"] = 2  # other inputs: only the patched rows make "2" what the source's were
    c["hooks"] = {"p": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": "patch", "source": source}]},
                  "r": {"at": "2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return c


def test_op_patch_reads_its_source_from_the_bucket(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "cache"))
    hookrun.run(cfg(URL, tmp_path))
    local = local_run(tmp_path)
    with h5py.File(local, "r") as f:
        clean = f["captures/h/0/output"][:]
        index = f["samples/index"][:]
    model = reference_model()
    with torch.no_grad():
        want = model[2](model[1](torch.from_numpy(clean))).numpy()
    path = hookrun.run(patched_cfg(tmp_path, URL, "patched.h5")).path
    with h5py.File(path, "r") as f:
        assert (f["samples/index"][:] == index).all()
        np.testing.assert_allclose(f["captures/r/2/output"][:], want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the inputs of this run alone would give other rows: the patch did something
        from hookrun.data import RandomTensors
        x = torch.stack([RandomTensors(n=N, shape=[8], num_classes=3, seed=2)[i][0] for i in range(N)])
        assert not np.allclose(model(x).numpy(), want, atol=1e-3)


def test_evaluate_mean_reads_the_means_from_the_bucket(s3, tmp_path, monkeypatch):
    from hookrun.runner.kinds.evaluate.ablations import read_means

    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "cache"))
    hookrun.run(cfg(URL, tmp_path))
    with h5py.File(local_run(tmp_path), "r") as f:
        mean = f["captures/h/0/output"][:].astype(np.float64).mean(0)
        targets = f["samples/target"][:]
    got = read_means(URL, [("0", "output")])
    np.testing.assert_allclose(got[("0", "output")], mean, rtol=1e-12)
    # a whole run with evaluate.mean=URL: the ablated forward puts that mean in place of layer 0's output
    c = cfg(str(tmp_path / "eval.h5"), tmp_path)
    c["hooks"] = {"s": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}}
    c["loss"] = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    c["evaluate"] = {"enabled": True, "ablation": "mean", "mean": URL}
    path = hookrun.run(c).path
    model = reference_model()
    with torch.no_grad():
        logits = model[2](model[1](torch.from_numpy(mean).float())).expand(len(targets), -1)
        ce = torch.nn.functional.cross_entropy(logits, torch.from_numpy(targets).long(), reduction="none").numpy()
    with h5py.File(path, "r") as f:
        per_batch = f["evaluation/model/ce_ablated"][:]
        assert f["evaluation"].attrs["mean"] == URL
    np.testing.assert_allclose(per_batch, ce.reshape(-1, 4).mean(1), rtol=1e-5)


def test_plot_draws_an_object_store_run_as_the_same_run_in_a_local_file(s3, tmp_path, monkeypatch):
    from matplotlib.image import imread

    from hookrun.cli import plot_command as plot

    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "fetched"))
    hookrun.run(cfg(URL, tmp_path))
    local = tmp_path / "cache" / "captures.h5"  # titles name the folder and file: cache/captures.h5 as the URL's
    hookrun.run(cfg(str(local), tmp_path))
    assert plot.main([URL, "--out", str(tmp_path / "remote")]) == 0  # (was: s3:/hookrun-test/..., no such file)
    assert plot.main([str(local), "--out", str(tmp_path / "here")]) == 0
    remote = sorted(p.name for p in (tmp_path / "remote").glob("*.png"))
    assert remote and remote == sorted(p.name for p in (tmp_path / "here").glob("*.png"))
    for name in remote:  # the same pixels: the figures were drawn from the same values
        np.testing.assert_array_equal(imread(tmp_path / "remote" / name), imread(tmp_path / "here" / name))


def test_inspect_verify_names_every_damaged_part_and_exits_1(s3, tmp_path, monkeypatch, capsys):
    from hookrun.cli.inspect_command import main

    server, client = s3
    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "cache"))
    hookrun.run(cfg(URL, tmp_path, checksum=True))
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/manifest.json")["Body"].read())
    parts = [p["name"] for p in manifest["parts"]]
    assert len(parts) >= 3
    assert main(["--verify", URL]) == 0
    capsys.readouterr()
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{parts[0]}", Body=b"\0" * manifest["parts"][0]["bytes"])
    client.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{parts[-1]}")
    assert main(["--verify", URL]) == 1  # as a local file's damage: every part checked, each named
    out, err = capsys.readouterr()
    damaged = [ln for ln in err.splitlines() if ln.startswith("hookrun.inspect: damaged:")]
    assert len(damaged) == 2 and parts[0] in damaged[0] and parts[-1] in damaged[1], err
    assert "DAMAGED, 2 problem(s)" in out


# -- one writer per URL --------------------------------------------------------------------------
def lock_object(client, **holder) -> None:
    body = {"host": "gpu-node-7", "pid": 4242, "started": "2026-11-25T10:00:00+0000", "expires": time.time() + 600,
            "token": "t", **holder}
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/writer.lock", Body=json.dumps(body).encode())


def keys(client) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def test_a_second_writer_or_a_resume_on_a_url_being_written_is_refused_naming_the_first(s3, tmp_path):
    server, client = s3
    lock_object(client)
    for extra in ({"overwrite": True}, {}):
        c = cfg(URL, tmp_path, **extra)
        c["resume"] = not extra
        with pytest.raises(ConfigError, match=r"^output.path: another hookrun run \(host gpu-node-7, pid 4242, started "
                                              r"2026-11-25T10:00:00\+0000\) is writing s3://hookrun-test/cache/captures.h5"):
            hookrun.run(c)
    assert keys(client) == [f"{PREFIX}/writer.lock"]  # nothing written by the refused runs


def test_the_lock_is_a_conditional_put_renewed_while_held_and_removed_at_the_end(s3, tmp_path):
    from hookrun.output.objects.object_folder import RemoteFolder
    from hookrun.output.objects.remote_lock import RemoteLock

    server, client = s3
    folder = RemoteFolder.open(URL)
    first = RemoteLock(folder, lease=3.0)
    with first:
        held = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/writer.lock")["Body"].read())
        assert held["host"] == socket.gethostname() and held["pid"] == __import__("os").getpid()
        with pytest.raises(ConfigError, match=rf"another hookrun run \(host {socket.gethostname()}, pid"):
            RemoteLock(RemoteFolder.open(URL), lease=3.0).acquire()  # a live holder (this process)
        time.sleep(2.0)  # renewed every 1 s: the lease moves on (3 s leases: a loaded machine's late renewal
        # must not let the lease end while the test still holds it)
        again = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/writer.lock")["Body"].read())
        assert again["token"] == held["token"] and again["expires"] > held["expires"] + 0.5
    assert keys(client) == []
    # a run holds it while it writes, and leaves nothing behind
    hookrun.run(cfg(URL, tmp_path))
    assert f"{PREFIX}/writer.lock" not in keys(client)


def test_a_stale_lock_is_taken_over_when_its_lease_ended_or_its_process_is_gone(s3, tmp_path, caplog):
    server, client = s3
    lock_object(client, expires=time.time() - 5)  # its writer stopped renewing it
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        assert hookrun.run(cfg(URL, tmp_path)).status == "complete"
    assert "held by host gpu-node-7, pid 4242" in caplog.text and "taken over" in caplog.text
    assert f"{PREFIX}/writer.lock" not in keys(client)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_object(client, host=socket.gethostname(), pid=int(dead.stdout))  # a kill -9 on this host: lease not yet over
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        assert hookrun.run(cfg(URL, tmp_path, overwrite=True)).status == "complete"
    assert "is no longer running on this host" in caplog.text


@pytest.mark.slow
def test_a_run_writing_in_another_process_refuses_a_second_and_its_kill_frees_the_url(s3, tmp_path):
    import os

    from conftest import ROOT

    server, client = s3
    c = cfg(URL, tmp_path, part_bytes=300)
    c["data"]["dataset"]["n"] = 64 * 6
    c["data"]["batch_size"] = 2
    first = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(c)], cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while f"{PREFIX}/writer.lock" not in keys(client) and time.monotonic() < deadline:
            time.sleep(0.05)
        for again in ({**c, "output": {**c["output"], "overwrite": True}}, {**c, "resume": True}):
            with pytest.raises(ConfigError, match=rf"another hookrun run \(host {socket.gethostname()}, pid {first.pid}, "):
                hookrun.run(again)
    finally:
        first.send_signal(9)
        first.wait()
    assert hookrun.run({**c, "resume": True}).status == "complete"  # its lock is taken over: its process is gone
    local = tmp_path / "local" / "captures.h5"
    hookrun.run({**cfg(str(local), tmp_path), "data": c["data"]})
    assert_same_as_local(client, local)
    assert f"{PREFIX}/writer.lock" not in keys(client)


def test_a_run_folders_url_names_the_cache_inside_it(s3, tmp_path):
    """open_run (and sae.from, inspect) of the URL above a cache, as a local run folder is given: the line
    names URL/captures.h5, whose manifest boto3 finds (was: 'no hookrun cache at ...' alone)."""
    from hookrun.errors import NotFoundError

    _, client = s3
    hookrun.run(cfg(URL, tmp_path))
    folder = URL.rsplit("/", 1)[0]
    assert client.head_object(Bucket=BUCKET, Key=f"{folder.split('/', 3)[3]}/captures.h5/manifest.json")
    with pytest.raises(NotFoundError, match=f"; did you mean {URL}\\?$"):
        hookrun.open_run(folder, cache_dir=tmp_path / "cache")
    with pytest.raises(NotFoundError) as elsewhere:
        hookrun.open_run(f"s3://{BUCKET}/nothing", cache_dir=tmp_path / "cache")
    assert "did you mean" not in str(elsewhere.value)
