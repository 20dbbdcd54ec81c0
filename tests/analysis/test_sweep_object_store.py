"""A Hydra sweep whose jobs write their runs to an object store (output.path=s3://.../${hydra:job.num}/...,
moto's S3 server on 127.0.0.1): open_sweep(folder) reads each job's run from its URL, and the table's probe
scores equal scikit-learn's LogisticRegression(tol=1e-10) on the features a raw forward hook records (was:
every job 'no file', and plot 'no two jobs wrote a number')."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from moto_s3 import BUCKET, moto_bucket, s3_env
from rank_runs import cli

import hookrun

pytest.importorskip("sklearn")
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket: the object-store tests' fixture
N = 96


def sklearn_test_score(C: float, at: str = "block3") -> float:
    """probe_shapes' probe of `at` (mean-pooled, standardized, split 0.25 seed 0) by scikit-learn, on the
    features a raw forward hook records from the same model and items."""
    from hookrun.data.shapes import shapes
    from hookrun.models import tiny_cnn

    model, data = tiny_cnn().eval(), shapes(N, noise=0.3)
    x, y = torch.stack([data[i][0] for i in range(N)]), np.array([int(data[i][1]) for i in range(N)])
    seen = {}
    h = model.get_submodule(at).register_forward_hook(lambda m, i, o: seen.__setitem__("o", o.detach()))
    with torch.no_grad():
        model(x)
    h.remove()
    feats = seen["o"].double().flatten(2).mean(-1).numpy()
    test = train_test_split(np.arange(N), test_size=0.25, random_state=0)[1]
    train = ~np.isin(np.arange(N), test)
    scaler = StandardScaler().fit(feats[train])
    fit = LogisticRegression(C=C, tol=1e-10, max_iter=100000).fit(scaler.transform(feats[train]), y[train])
    return float(fit.score(scaler.transform(feats[test]), y[test]))


def test_a_sweep_written_to_the_bucket_reads_every_jobs_run(s3, tmp_path):
    server, _ = s3
    done = cli("-m", "experiment=probe_shapes", f"data.dataset.size={N}", "data.batch_size=32", "probe.at=[block3]",
               "probe.control=false", "device=cpu", "progress=false", "probe.C=0.05,1",
               f"output.path=s3://{BUCKET}/sweep/${{hydra:job.num}}/captures.h5", "hydra.sweep.dir=sweep",
               cwd=tmp_path, env=s3_env(server))
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = hookrun.open_sweep(tmp_path / "sweep")
    assert [str(j.file) for j in sweep.jobs] == [f"s3://{BUCKET}/sweep/{n}/captures.h5" for n in (0, 1)]
    rows = sweep.table(stats=()).rows
    assert [r["status"] for r in rows] == ["complete", "complete"]
    assert [r["test@block3"] for r in rows] == [pytest.approx(sklearn_test_score(C), abs=1e-12) for C in (0.05, 1.0)]
    with sweep.jobs[1].open() as run:
        assert run.probes().rows[0]["test"] == rows[1]["test@block3"]


def test_one_url_for_every_job_is_refused_before_any_job_writes(s3, tmp_path):
    """As an absolute local path is: with output.overwrite=true each job replaced the last one's run at the URL
    (exit 0), and open_sweep read job 1's probes as job 0's; now one line, exit 2, and the bucket holds nothing."""
    server, client = s3
    done = cli("-m", "experiment=probe_shapes", "data.dataset.size=32", "data.batch_size=32", "probe.at=[block3]",
               "probe.control=false", "device=cpu", "progress=false", "probe.C=0.05,1", "output.overwrite=true",
               f"output.path=s3://{BUCKET}/one/captures.h5", "hydra.sweep.dir=sweep", cwd=tmp_path, env=s3_env(server))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("hookrun: error:")]
    assert lines == [f"hookrun: error: output.path=s3://{BUCKET}/one/captures.h5 is an object-store URL: every job of a "
                     "multirun would write the same file; give one with ${hydra:job.num} in it"], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert client.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0
