"""The logistic probe's pieces against scikit-learn, without a run: the objective and its gradient
(numpy on CPU blocks, torch as on a GPU) against sklearn's own LinearModelLoss at random weights; the
split against train_test_split over many sizes, fractions and seeds; a probe run's process imports no
scikit-learn (about 100 MB); a seed the split cannot take is one line before any batch."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")
from conftest import ENV  # noqa: E402
from sklearn._loss.loss import HalfBinomialLoss, HalfMultinomialLoss  # noqa: E402
from sklearn.linear_model._linear_loss import LinearModelLoss  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hookrun  # noqa: E402
from hookrun.errors import HookrunError  # noqa: E402
from hookrun.runner.kinds.probe.fit import split_items  # noqa: E402
from hookrun.runner.kinds.probe.logistic import objective  # noqa: E402


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("classes", [2, 4])
@pytest.mark.parametrize("masked", [False, True])
def test_objective_and_gradient_equal_sklearns_loss(engine, classes, masked) -> None:
    rng = np.random.default_rng(classes)
    n, d, C = 90, 7, 0.4
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 3, size=d) + rng.normal(size=d)
    y = rng.integers(0, classes, size=n)
    rows = rng.random(n) < 0.7 if masked else np.ones(n, bool)
    mean, scale = x[rows].mean(0), x[rows].std(0)
    k = 1 if classes == 2 else classes
    w = rng.normal(size=k * (d + 1)) * 0.3
    blocks = lambda: [(s, torch.from_numpy(x[s:s + 32])) for s in range(0, n, 32)]  # noqa: E731
    f, g = objective(blocks, y, rows, classes, C, w, mean, scale, engine=engine)
    xs = (x[rows] - mean) / scale
    loss = LinearModelLoss(HalfBinomialLoss() if k == 1 else HalfMultinomialLoss(n_classes=classes), True)
    want_f, want_g = loss.loss_gradient(w.reshape(k, d + 1) if k > 1 else w, xs, y[rows].astype(float),
                                        l2_reg_strength=1.0 / (C * int(rows.sum())))  # (classes, d + 1): ours
    want_g = np.asarray(want_g).reshape(-1)
    assert f == pytest.approx(want_f, rel=1e-12)
    np.testing.assert_allclose(g, want_g, rtol=1e-10, atol=1e-12)


def test_split_equals_train_test_split() -> None:
    checked = 0
    for n in [*range(1, 41), 97, 1000]:
        items = np.arange(n) * 3 + 5
        for test in (0.01, 0.1, 0.25, 0.3, 0.5, 0.9, 0.99):
            if n - math.ceil(test * n) == 0:
                continue  # scikit-learn refuses an empty training set; fit_point says it in one line
            for seed in (0, 1, 7, 2**32 - 1):
                want = train_test_split(items, test_size=test, random_state=seed)[1]
                assert split_items(items, test, seed).tolist() == want.tolist(), (n, test, seed)
                checked += 1
    assert checked > 900


@pytest.mark.slow
def test_a_probe_run_imports_no_sklearn(tmp_path) -> None:
    script = f"""
import sys, torch, hookrun
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
g = torch.Generator().manual_seed(0)
x = torch.randn(48, 6, generator=g)
data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
hookrun.run({{"data": {{"batch_size": 16}}, "device": "cpu", "progress": False,
             "output": {{"path": {str(tmp_path / "p.h5")!r}}}, "probe": {{"at": ["0", "2"], "target": "label"}}}},
            model=model, dataset=data)
with hookrun.open_run({str(tmp_path / "p.h5")!r}) as run:
    assert len(run.probes()) == 2
print("sklearn" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("seed", [-1, 2**32, 0.5])
def test_a_seed_the_split_cannot_take_is_one_line(tmp_path, seed) -> None:
    cfg = {"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
           "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 16}, "batch_size": 8},
           "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "split": {"seed": seed}}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg)
    assert "probe.split.seed" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("missing", ["scipy", "threadpoolctl"])
def test_without_its_solvers_modules_a_probe_is_one_line_before_any_batch(tmp_path, monkeypatch, missing) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    cfg = {"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
           "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 16}, "batch_size": 8},
           "output": {"path": str(tmp_path / "p.h5")}, "probe": {"at": ["block1"], "target": "label"}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg)
    assert "hookrun[represent]" in str(err.value) and missing in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "p.h5").exists()


def _blas_threads() -> int:
    from threadpoolctl import threadpool_info

    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_the_solver_runs_on_one_blas_thread_and_gives_the_threads_back(tmp_path, monkeypatch) -> None:
    """OpenBLAS's threads woken for each of the solver's small products made a 768 x 512 solve 10x
    slower on 2 cores (hookrun/runner/kinds/probe/logistic.py's solver_threads): inside a run's
    solve BLAS has one thread; before and after, the process's own setting."""
    from threadpoolctl import threadpool_limits

    from hookrun.runner.kinds.probe import logistic

    seen: list[int] = []
    real = logistic.objective

    def watched(*args, **kwargs):
        seen.append(_blas_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(logistic, "objective", watched)
    cfg = {"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
           "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 32}, "batch_size": 8},
           "output": {"path": str(tmp_path / "p.h5")}, "probe": {"at": ["block1"], "target": "label"}}
    with threadpool_limits(limits=2, user_api="blas"):
        hookrun.run(cfg)
        assert _blas_threads() == 2
    assert seen and set(seen) == {1}
    with threadpool_limits(limits=2, user_api="blas"):  # large rows on the CPU keep the threads; a GPU's never
        with logistic.solver_threads(40000, 2048, "cpu"):
            assert _blas_threads() == 2
        with logistic.solver_threads(40000, 2048, "cuda"), logistic.solver_threads(768, 512, "cpu"):
            assert _blas_threads() == 1
