"""Similarity over two ranks equals one process and numpy: each accumulator saved by one rank and
merged by another equals the whole data's (numpy's definitions, test_similarity_engine.py), and a
torchrun run of two ranks (the gram route: rank 1's rows after rank 0's) equals the one-process run
and linear CKA computed by numpy on features a raw forward hook records."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from rank_runs import TORCHRUN, cli
from test_similarity_engine import cka, data, flat, run, unbiased
from test_similarity_runs import cfg, file_matrix, grams, images, recorded

import hookrun
from hookrun.runner.kinds.similarity.accumulate import accumulator, pairs_of


def merged(route: str, series: list[np.ndarray], batch: int, split: int, tmp_path, **kw) -> np.ndarray:
    """Batches before `split` fed to one accumulator, the rest to another, saved, and merged into the first."""
    accs = [accumulator(route, pairs_of(len(series), None), batch=batch, **kw) for _ in range(2)]
    for s in range(0, len(series[0]), batch):
        accs[s >= split].add([torch.from_numpy(x[s:s + batch]) for x in series])
    accs[1].save(tmp_path / "rank1")
    accs[0].merge(tmp_path / "rank1")
    out = accs[0].matrix((len(series), len(series)))
    for a in accs:
        getattr(a, "close", lambda: None)()
    return out


@pytest.mark.parametrize("route", ["feature", "gram"])
def test_exact_routes_merged_equal_linear_cka_on_the_whole_data(tmp_path, route) -> None:
    series = data(30)
    series[2] = series[2] + 50.0  # rank 1's shift far from rank 0's: the move between shifts must be exact
    k = [flat(x) @ flat(x).T for x in series]
    want = np.array([[cka(a, b) for b in k] for a in k])
    got = merged(route, series, 7, 14, tmp_path)
    if route == "gram":  # (rank 1's rows after rank 0's: one process's rows, to the bit)
        np.testing.assert_array_equal(got, run(route, series, 7))
    np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize("route", ["feature", "gram"])
def test_unbiased_merged_equals_songs_hsic_on_the_whole_data(tmp_path, route) -> None:
    """The feature route's row norms and their sums moved from rank 1's shift to rank 0's (measures.moved)."""
    series = data(30, seed=3)
    series[1] = series[1] - 40.0  # rank 1's shift far from rank 0's
    k = [flat(x) @ flat(x).T for x in series]
    want = np.array([[unbiased(a, b) / np.sqrt(unbiased(a, a) * unbiased(b, b)) for b in k] for a in k])
    np.testing.assert_allclose(merged(route, series, 7, 14, tmp_path, unbiased=True), want, rtol=1e-9)


def test_minibatch_merged_equals_the_unbiased_estimator_on_the_same_batches(tmp_path) -> None:
    series = data(30)  # batches of 6: five full ones; rank 1 has batches 3 and 4
    f = [flat(x) for x in series]
    batches = [slice(s, s + 6) for s in range(0, 30, 6)]

    def mean_hsic(a, b):
        return np.mean([unbiased(a[s] @ a[s].T, b[s] @ b[s].T) for s in batches])

    want = [[mean_hsic(a, b) / np.sqrt(mean_hsic(a, a) * mean_hsic(b, b)) for b in f] for a in f]
    np.testing.assert_allclose(merged("minibatch", series, 6, 18, tmp_path), want, rtol=1e-9)


ARGS = ["model=tiny_cnn", "data=shapes", "data.dataset.size=40", "data.batch_size=8", "device=cpu", "progress=false",
        "+similarity.at=[block1,block3,fc]", "+similarity.pool=flatten"]


@pytest.mark.slow
def test_two_ranks_equal_one_process_and_numpy(tmp_path) -> None:
    from hookrun.models import tiny_cnn

    two = cli(*ARGS, "hydra.run.dir=two", cwd=tmp_path, launcher=TORCHRUN)
    assert two.returncode == 0, two.stderr[-3000:]
    one = hookrun.run(cfg(tmp_path / "one.h5", n=40, batch=8, at=["block1", "block3", "fc"], pool="flatten")).path
    got, meta = file_matrix(tmp_path / "two" / "captures.h5")
    ref, _ = file_matrix(one)
    assert meta["route"] == "gram"
    with h5py.File(tmp_path / "two" / "captures.h5") as f:
        assert f.attrs["world_size"] == 2 and f.attrs["status"] == "complete"
    np.testing.assert_array_equal(got, ref)  # rank 1's rows after rank 0's: the one-process Gram matrices
    k = grams(recorded(tiny_cnn(), ["block1", "block3", "fc"], images(40), "flatten"))
    np.testing.assert_allclose(got, [[cka(a, b) for b in k] for a in k], rtol=1e-6)
    assert not list((tmp_path / "two").glob(".hookrun-similarity-*"))
