"""Helpers for the multi-process and resume tests: a rank (or a lone run) that kills itself when told,
wrapped models."""

from __future__ import annotations

import os
import signal
import time

import torch

import my_pkg


def kill_when_told(ev) -> None:
    """A user action: SIGKILL this process at batch STEP on rank RANK, where the environment has
    HOOKRUN_TEST_KILL=RANK:STEP (outside the config, which resume compares); with
    HOOKRUN_TEST_SLEEP=RANK:STEP:SECONDS that rank's batch STEP first sleeps SECONDS (a slow batch);
    with HOOKRUN_TEST_WAIT_STOP=RANK:STEP that rank's batch STEP lasts until the process is sent SIGTERM
    (the batch in flight when torchrun stops the group)."""
    stop = os.environ.get("HOOKRUN_TEST_WAIT_STOP")
    if stop and ev.call == 0:
        rank, step = map(int, stop.split(":"))
        if int(os.environ.get("RANK", "0")) == rank and ev.step == step:
            wait_for_a_stop_signal()
    slow = os.environ.get("HOOKRUN_TEST_SLEEP")
    if slow and ev.call == 0:
        rank, step, seconds = slow.split(":")
        if int(os.environ.get("RANK", "0")) == int(rank) and ev.step == int(step):
            time.sleep(float(seconds))
    told = os.environ.get("HOOKRUN_TEST_KILL")
    if told and ev.call == 0:
        rank, step = map(int, told.split(":"))
        if int(os.environ.get("RANK", os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0"))) == rank and ev.step == step:
            time.sleep(1.5)  # the writer thread flushes the batches before this one
            os.kill(os.getpid(), signal.SIGKILL)


def wait_for_a_stop_signal(limit: float = 120) -> None:
    """Return once this process has been sent SIGTERM (hookrun's own handler still runs: it asks the loop
    to stop after this batch), or after `limit` seconds."""
    came = []
    previous = signal.getsignal(signal.SIGTERM)

    def handle(signum, frame):
        came.append(signum)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handle)
    try:
        deadline = time.monotonic() + limit
        while not came and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)


def compiled_net(width: int = 4) -> torch.nn.Module:
    """my_pkg.Net under torch.compile (the eager backend: no compiler needed)."""
    return torch.compile(my_pkg.Net(width=width), backend="eager")


def data_parallel_net(width: int = 4) -> torch.nn.Module:
    """my_pkg.Net under nn.DataParallel (its names start with `module.`)."""
    return torch.nn.DataParallel(my_pkg.Net(width=width))


def kill_when_rank_1_is_done(ev) -> None:
    """A user action: SIGKILL this process at batch STEP on rank RANK, where the environment has
    HOOKRUN_TEST_KILL_AFTER=RANK:STEP, once rank 1 has handed its part over and ended: its hand-over file
    (.hookrun-KIND-*.rank-00001) is in HOOKRUN_TEST_RUN_DIR and its shard says `complete` (rank_1_complete)
    (waits up to 120 s; the state "rank 1 finished and handed over, rank 0 killed before merging")."""
    import glob

    told = os.environ.get("HOOKRUN_TEST_KILL_AFTER")
    if not told or ev.call != 0:
        return
    rank, step = map(int, told.split(":"))
    if int(os.environ.get("RANK", "0")) != rank or ev.step != step:
        return
    folder = os.environ["HOOKRUN_TEST_RUN_DIR"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if glob.glob(os.path.join(folder, ".hookrun-*.rank-00001")) and rank_1_complete(folder):
            break
        time.sleep(0.1)
    else:
        raise RuntimeError("rank 1 did not hand over and end within 120 s")
    time.sleep(0.5)  # (rank 1's process ends)
    os.kill(os.getpid(), signal.SIGKILL)


def rank_1_complete(folder: str) -> bool:
    """Whether rank 1's shard says `complete`: its file captures.rank-00001.h5 in `folder`, or, for a run
    in an object store, its manifest at HOOKRUN_TEST_RANK_1_MANIFEST (s3://BUCKET/KEY, read with boto3)."""
    import json

    import h5py

    url = os.environ.get("HOOKRUN_TEST_RANK_1_MANIFEST")
    if url:
        import boto3

        bucket, key = url.removeprefix("s3://").split("/", 1)
        client = boto3.client("s3")  # (AWS_ENDPOINT_URL: the test's server)
        try:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except client.exceptions.NoSuchKey:
            return False
        return json.loads(body)["status"] == "complete"
    try:
        with h5py.File(os.path.join(folder, "captures.rank-00001.h5"), "r") as f:
            return f.attrs.get("status") == "complete"
    except Exception:  # noqa: BLE001 (not there yet, or read between two of the writer's writes: h5py's
        return False  # errors are not all OSError there, and one raised here would fail this rank instead)
