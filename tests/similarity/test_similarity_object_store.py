"""A similarity run to an object store (output.path s3://..., moto's S3 server on 127.0.0.1): the matrix,
written once after the last batch, goes into the last batch's part, and open_run(url).similarity() reads
it equal to the uninterrupted one-process local run's bit for bit and to linear CKA computed by numpy on
the features raw forward hooks record. One process with a part per batch; two ranks (torchrun, the Gram
route) with rank 0 SIGKILLed once rank 1 had handed its rows over and its manifest said complete, then
resumed: rank 1 rebuilds its rows from its complete shard (rejoin)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from moto_s3 import BUCKET, moto_bucket, s3_env
from rank_runs import TORCHRUN, cli
from test_similarity_engine import cka
from test_similarity_rank_resume import AT, KILLS
from test_similarity_ranks import ARGS
from test_similarity_runs import cfg, file_matrix, grams, images, recorded

import hookrun

s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket: the object-store tests' fixture
PREFIX = "cka/captures.h5"
URL = f"s3://{BUCKET}/{PREFIX}"
RUN = [*ARGS, KILLS, "output.flush_every=1", "hydra.run.dir=run", f"output.path={URL}"]  # 5 batches: 0-1, 2-4


@pytest.fixture(scope="module")
def want(tmp_path_factory) -> tuple[np.ndarray, np.ndarray]:
    """The uninterrupted one-process local run's matrix, and numpy's linear CKA on raw-hook features."""
    from hookrun.models import tiny_cnn

    one = hookrun.run(cfg(tmp_path_factory.mktemp("one") / "one.h5", n=40, batch=8, at=AT, pool="flatten")).path
    k = grams(recorded(tiny_cnn(), AT, images(40), "flatten"))
    return file_matrix(one)[0], np.array([[cka(a, b) for b in k] for a in k])


def status(client, name: str) -> str:
    """A manifest's status, read with boto3."""
    return json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{name}")["Body"].read())["status"]


def assert_matrix(tmp_path, want) -> None:
    with hookrun.open_run(URL, cache_dir=tmp_path / "cache") as r:
        assert r.status == "complete"
        got = r.similarity()
    assert got.attrs["route"] == "gram" and list(got.coords["at"].values) == AT
    np.testing.assert_array_equal(got.values, want[0])  # the same rows, in batch order: bit for bit
    np.testing.assert_allclose(got.values, want[1], rtol=1e-6)


def test_one_process_with_a_part_per_batch_holds_the_matrix_in_its_last_part(s3, tmp_path, want) -> None:
    _, client = s3
    run = cfg(URL, n=40, batch=8, at=AT, pool="flatten")
    run["output"].update(staging=str(tmp_path / "stage"), part_bytes=1)  # each batch's part full at once
    assert hookrun.run(run).status == "complete"
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/manifest.json")["Body"].read())
    assert [p["steps"] for p in manifest["parts"]] == [[s, s + 1] for s in range(5)]  # no part without a batch
    holders = [k for k, p in enumerate(manifest["parts"]) if "/captures/similarity/__model__/linear_cka" in p["rows"]]
    assert holders == [4]  # the last part only
    assert_matrix(tmp_path, want)


@pytest.mark.slow
def test_rank_0_killed_after_rank_1_handed_over_resumes_to_the_one_process_matrix(s3, tmp_path, want) -> None:
    server, client = s3
    run = tmp_path / "run"
    env = {**s3_env(server), "HOOKRUN_TEST_KILL_AFTER": "0:1", "HOOKRUN_TEST_RUN_DIR": str(run),
           "HOOKRUN_TEST_RANK_1_MANIFEST": f"{URL}/manifest.rank-00001.json"}  # rank 0, its last batch
    killed = cli(*RUN, cwd=tmp_path, launcher=TORCHRUN, env=env)
    assert killed.returncode != 0
    assert status(client, "manifest.rank-00001.json") == "complete"
    assert status(client, "manifest.rank-00000.json") != "complete" and status(client, "manifest.json") != "complete"
    assert [p.is_dir() for p in run.glob(".hookrun-similarity-*.rank-00001")] == [True]  # in the staging folder

    resumed = cli(*RUN, "resume=true", cwd=tmp_path, launcher=TORCHRUN, env=s3_env(server))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 1: similarity: the features of the 3 kept batch(es) recomputed" in resumed.stdout + resumed.stderr
    assert not list(run.glob(".hookrun-similarity-*"))  # merged and removed
    assert [status(client, n) for n in ("manifest.json", "manifest.rank-00000.json", "manifest.rank-00001.json")] == \
        ["complete"] * 3
    assert_matrix(tmp_path, want)


def test_killed_after_its_last_part_before_the_manifest_said_complete_resumes_to_the_same_matrix(s3, tmp_path, want):
    """The state a kill leaves between the last part's upload (the matrix in it) and the manifest's
    'complete': the manifest set back to 'running' by hand. Resumed, every batch is kept; the matrix,
    recomputed from the same batches, is not written again in a part of its own (which made the run
    unreadable: '/samples/target is in 5 of 6 shards')."""
    _, client = s3
    run = cfg(URL, n=40, batch=8, at=AT, pool="flatten")
    run["output"].update(staging=str(tmp_path / "stage"), part_bytes=1)
    assert hookrun.run(run).status == "complete"
    key = f"{PREFIX}/manifest.json"
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({**manifest, "status": "running"}).encode())
    assert hookrun.run({**run, "resume": True}).status == "complete"
    assert status(client, "manifest.json") == "complete"
    assert [p["steps"] for p in json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())["parts"]] == \
        [[s, s + 1] for s in range(5)]
    assert_matrix(tmp_path, want)
