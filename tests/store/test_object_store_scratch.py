"""A loader over a cache in an object store (moto's S3 server on 127.0.0.1) SIGKILLed mid-epoch leaves its
prefetched parts in its own folder of cache_dir; the next reader of this host removes them (was: kept for good,
up to prefetch + 1 parts of output.part_bytes, 2 GiB by default, per killed run), and reads every row once,
as h5py reads them from the same run written to a local file."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import ENV
from moto_s3 import URL, cfg, local_run, moto_bucket, s3_env

import hookrun

s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket: the object-store tests' fixture

KILLED = """  # a loader that has read one batch (its parts being fetched), then SIGKILLed
import os, signal, sys, time, hookrun
run = hookrun.open_run(sys.argv[1], cache_dir=sys.argv[2])
it = iter(run.loader("h/0/output", batch_size=8, seed=0, prefetch=2, buffer_bytes=512))
next(it)
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not any(p.suffix == ".h5" for d in os.scandir(sys.argv[2])
                                              if d.name.startswith("stream-") for p in map(__import__("pathlib").Path, os.scandir(d.path))):
    time.sleep(0.05)  # (until the thread has fetched a part ahead)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_loaders_parts_are_removed_by_the_next_reader(s3, tmp_path):
    server, _ = s3
    hookrun.run(cfg(URL, tmp_path))  # parts of ~700 bytes: many to prefetch
    cache = tmp_path / "cache"
    killed = subprocess.run([sys.executable, "-c", KILLED, URL, str(cache)], capture_output=True, text=True,
                            env={**os.environ, **ENV, **s3_env(server)})
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = [p for p in cache.iterdir() if p.name.startswith("stream-")]
    assert len(left) == 1 and list(left[0].iterdir())  # its parts, fetched ahead
    with hookrun.open_run(URL, cache_dir=cache) as run:
        got = np.concatenate(list(run.loader("h/0/output", batch_size=8, shuffle=False)))
        assert not left[0].exists()  # the dead process's folder, removed as this loader made its own
    with h5py.File(local_run(tmp_path), "r") as f:
        np.testing.assert_array_equal(got, f["captures/h/0/output"][:])
    assert not [p for p in cache.iterdir() if p.name.startswith("stream-")]  # this one's, removed at its end
