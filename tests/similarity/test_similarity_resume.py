"""A similarity run killed inside a flush (as kill -9 would) and run again with resume=true ends with
the uninterrupted run's matrix, and with linear CKA computed by numpy on features a raw forward hook
records: the kept batches' features are recomputed into the accumulator."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from kill_in_flush import killed_inside_a_flush
from test_similarity_engine import cka, unbiased
from test_similarity_runs import cfg, file_matrix, grams, images, recorded

import hookrun

AT = ["block1", "block3", "fc"]


@pytest.mark.slow
@pytest.mark.parametrize(("estimator", "pool"), [("exact", "flatten"), ("minibatch", "mean")])
def test_a_killed_run_resumes_to_the_uninterrupted_matrix(tmp_path, estimator, pool) -> None:
    from hookrun.models.tiny_cnn import tiny_cnn

    def config(name: str) -> dict:
        c = cfg(tmp_path / name, n=30, batch=5, at=AT, pool=pool, estimator=estimator)
        c["output"]["flush_every"] = 1
        return c

    whole = hookrun.run(config("whole.h5")).path
    out = killed_inside_a_flush(config("k.h5"), 4)
    assert out.returncode == 9, out.stderr[-2000:]
    with h5py.File(tmp_path / "k.h5") as f:
        assert f.attrs["status"] != "complete" and 0 < f["samples/index"].shape[0] < 30
        assert "similarity" not in f.get("captures", {})
    assert hookrun.run({**config("k.h5"), "resume": True}).status == "complete"
    got, meta = file_matrix(tmp_path / "k.h5")
    want, _ = file_matrix(whole)
    np.testing.assert_array_equal(got, want)
    feats = recorded(tiny_cnn(), AT, images(30), pool)
    if estimator == "exact":
        k = grams(feats)
        ref = [[cka(a, b) for b in k] for a in k]
    else:
        batches = [slice(s, s + 5) for s in range(0, 30, 5)]

        def mean_hsic(a, b):
            return np.mean([unbiased(a[s] @ a[s].T, b[s] @ b[s].T) for s in batches])

        ref = [[mean_hsic(a, b) / np.sqrt(mean_hsic(a, a) * mean_hsic(b, b)) for b in feats] for a in feats]
    np.testing.assert_allclose(got, ref, rtol=1e-6)


@pytest.mark.slow
def test_a_resumed_run_recomputes_its_kept_batches_through_the_users_interventions(tmp_path) -> None:
    """`hooks:` that change outputs (block2 scaled by 0.1, block1 by -1) change the features; the kept
    batches' features were recomputed without them (0.8748 where 0.3932 belongs). Reference: raw forward
    hooks making the same changes, numpy's CKA of the means."""
    from hookrun.models.tiny_cnn import tiny_cnn

    hooks = {"abl": {"at": "block2", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.1}]},
             "neg": {"at": "block1", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": -1.0}]}}

    def config(name: str) -> dict:
        c = cfg(tmp_path / name, n=40, batch=5, at=AT, pool="mean")
        c["output"]["flush_every"] = 1
        return {**c, "hooks": hooks}

    whole = hookrun.run(config("whole.h5")).path
    assert killed_inside_a_flush(config("k.h5"), 4).returncode == 9
    assert hookrun.run({**config("k.h5"), "resume": True}).status == "complete"
    got, _ = file_matrix(tmp_path / "k.h5")
    want, _ = file_matrix(whole)
    model = tiny_cnn()
    model.block2.register_forward_hook(lambda m, i, o: o * 0.1)
    model.block1.register_forward_hook(lambda m, i, o: o * -1.0)
    k = grams(recorded(model, AT, images(40), "mean"))
    ref = np.array([[cka(a, b) for b in k] for a in k])
    np.testing.assert_allclose(want, ref, rtol=1e-6)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
