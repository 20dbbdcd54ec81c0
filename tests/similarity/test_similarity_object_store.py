"""A similarity run to an object store (output.path s3://..., moto's S3 server on 127.0.0.1) is refused
before any batch in one line naming what works (a local file), in one process and over two ranks
(torchrun): the matrix is written once after the last batch, which an object-store run's parts do not
hold yet (PartedStore has no end-of-run arrays), so the run would otherwise fail after the whole pass.
The same command to a local file runs (tests/similarity/test_similarity_ranks.py)."""

from __future__ import annotations

import pytest
from moto_s3 import BUCKET, moto_bucket, s3_env
from rank_runs import TORCHRUN, cli
from test_similarity_ranks import ARGS
from test_similarity_runs import cfg

import hookrun
from hookrun.errors import ConfigError

s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket: the object-store tests' fixture
URL = f"s3://{BUCKET}/cka/captures.h5"
LINE = (r"similarity with output\.path=s3://hookrun-test/cka/captures\.h5: the matrix is written once after the last "
        r"batch, which an object-store run's parts do not hold yet; write to a local file")


def keys(client) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def test_one_process_to_the_bucket_is_refused_before_anything_is_written(s3, tmp_path) -> None:
    _, client = s3
    run = cfg(URL, n=40, batch=8, at=["block1", "fc"], pool="flatten")
    run["output"]["staging"] = str(tmp_path / "stage")
    with pytest.raises(ConfigError, match=LINE):
        hookrun.run(run)
    assert keys(client) == []  # (its lock object, released)


@pytest.mark.slow
def test_two_ranks_to_the_bucket_are_refused_in_one_line_before_any_batch(s3, tmp_path) -> None:
    server, client = s3
    proc = cli(*ARGS, "hydra.run.dir=run", f"output.path={URL}", cwd=tmp_path, launcher=TORCHRUN, env=s3_env(server))
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hookrun:")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("hookrun: error: similarity with output.path=s3://") and "write to a local file" in lines[0]
    assert not [k for k in keys(client) if "/rank-" in k]  # no rank wrote a part: no batch ran
    assert not list((tmp_path / "run").glob(".hookrun-similarity-*"))
