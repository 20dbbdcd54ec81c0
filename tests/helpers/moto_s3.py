"""A real S3 API for the object-store tests: moto's server on 127.0.0.1, a bucket, the small run
they all write, and the bucket's objects read back with boto3 and h5py (no hookrun code).

    s3 = pytest.fixture(moto_bucket)          # a test module's fixture: (server, client), stopped after
    hookrun.run(cfg(URL, tmp_path))           # the run, in parts of ~700 bytes in the bucket
    assert_same_as_local(client, local_run(tmp_path))
"""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

import hookrun
from hookrun.data import RandomTensors

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

BUCKET, KEY_ID, SECRET = "hookrun-test", "AKIDTESTKEY123", "s3cr3t-value-never-written-0042"
N, BATCH = 64, 4
URL = f"s3://{BUCKET}/cache/captures.h5"


class Server:
    def __init__(self, port: int = 0) -> None:
        self.moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.moto.start()
        self.host, self.port = self.moto.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.moto.stop()


def s3_env(server: Server) -> dict[str, str]:
    """The AWS variables that point boto3 and s3fs at `server` (also for a test's child processes)."""
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1"}


def moto_bucket(monkeypatch) -> Iterator[tuple[Server, object]]:
    """A moto server with one clean bucket, the AWS variables set to it: (server, boto3 client)."""
    server = Server()
    for key, value in s3_env(server).items():
        monkeypatch.setenv(key, value)
    urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/moto-api/reset", method="POST"))  # a clean store
    client = boto3.client("s3", endpoint_url=server.endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield server, client
    server.stop()


def cfg(path: str, tmp_path: Path, **output) -> dict:
    return {
        "model": {"_target_": "torch.nn.Sequential", "_args_": [
            {"_target_": "torch.nn.Linear", "in_features": 8, "out_features": 16}, {"_target_": "torch.nn.ReLU"},
            {"_target_": "torch.nn.Linear", "in_features": 16, "out_features": 4}]},
        "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N, "shape": [8], "num_classes": 3,
                             "seed": 1}, "batch_size": BATCH},
        "device": "cpu", "progress": False, "seed": 3,
        "hooks": {"h": {"at": ["0", "2"], "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
        "output": {"path": path, "staging": str(tmp_path / "stage"), "part_bytes": 700, **output},
    }


def local_run(tmp_path: Path, **output) -> Path:
    out = tmp_path / "local" / "captures.h5"
    hookrun.run(cfg(str(out), tmp_path, **output))
    return out


def bucket_parts(client, prefix: str = "cache/captures.h5") -> tuple[dict, list[h5py.File]]:
    """The manifest and every part it lists, read with boto3 and h5py (no hookrun code)."""
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key=f"{prefix}/manifest.json")["Body"].read())
    files = [h5py.File(io.BytesIO(client.get_object(Bucket=BUCKET, Key=f"{prefix}/{p['name']}")["Body"].read()), "r")
             for p in manifest["parts"]]
    return manifest, files


def assert_same_as_local(client, local: Path) -> dict:
    manifest, parts = bucket_parts(client)
    with h5py.File(local, "r") as f:
        names = []
        f["captures"].visititems(lambda n, o: names.append(f"captures/{n}") if isinstance(o, h5py.Dataset) else None)
        assert names
        for name in [*names, "samples/index", "samples/step", "samples/target"]:
            want = f[name][:]
            got = np.concatenate([p[name][:] for p in parts])
            np.testing.assert_array_equal(got, want, err_msg=name)
        for p in parts:
            assert p.attrs["status"] == "complete" and p.attrs["format_version"] == f.attrs["format_version"]
    for p in parts:
        p.close()
    return manifest


RUNNER = """  # `python -c RUNNER CONFIG_JSON`: one run in a child process (a test kills it, or reads its exit)
import sys, hookrun, json
cfg = json.loads(sys.argv[1])
hookrun.run(cfg)
"""


class StopsTheStore(RandomTensors):
    """cfg's data as a live dataset (n rows): reading sample `at` calls `stop` (the S3 server goes away
    mid-run); `stop=None` reads plainly."""

    def __init__(self, stop, at: int, n: int = N) -> None:
        super().__init__(n=n, shape=(8,), num_classes=3, seed=1)
        self.stop, self.at = stop, at

    def __getitem__(self, i: int):
        if i == self.at and self.stop is not None:
            self.stop()
            self.stop = None
        return super().__getitem__(i)
