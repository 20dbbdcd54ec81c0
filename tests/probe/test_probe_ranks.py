"""A probe run over two ranks (torchrun, gloo-free: the ranks' key-value store and the run folder)
equals the one-process run, and scikit-learn's Ridge on the features a raw forward hook records:
rank 1 hands its rows to rank 0, which adds them in batch order and fits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rank_runs import TORCHRUN, cli

import hookrun

pytest.importorskip("sklearn")
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

N, B, AT = 80, 16, ["block1", "block3"]  # 5 batches: rank 0 runs 0-1, rank 1 runs 2-4
ARGS = ["experiment=probe_shapes", f"data.dataset.size={N}", f"data.batch_size={B}", "probe.at=[block1,block3]",
        "probe.method=ridge", "probe.alpha=2.0", "probe.memory=4MB", "device=cpu", "progress=false"]


def reference(at: str, alpha: float = 2.0, n: int = N) -> tuple[np.ndarray, np.ndarray, float]:
    """sklearn: StandardScaler -> Ridge on the one-hot labels of the training items, features pooled by
    numpy from a raw forward hook on the same model and items; (weight, bias) folded as the file's."""
    from hookrun.data.shapes import shapes
    from hookrun.models import tiny_cnn

    model, data = tiny_cnn().eval(), shapes(n, noise=0.3)
    x = torch.stack([data[i][0] for i in range(n)])
    y = np.array([int(data[i][1]) for i in range(n)])
    seen = {}
    h = model.get_submodule(at).register_forward_hook(lambda m, i, o: seen.__setitem__("o", o.detach()))
    with torch.no_grad():
        model(x)
    h.remove()
    o = seen["o"].double().numpy()
    feats = o.reshape(*o.shape[:2], -1).mean(-1) if o.ndim > 2 else o
    test = train_test_split(np.arange(n), test_size=0.25, random_state=0)[1]
    train = ~np.isin(np.arange(n), test)
    scaler = StandardScaler().fit(feats[train])
    classes = np.unique(y[train])
    onehot = (y[train][:, None] == classes[None]).astype(np.float64)
    r = Ridge(alpha=alpha).fit(scaler.transform(feats[train]), onehot)
    weight = r.coef_ / scaler.scale_
    pred = classes[np.argmax(feats[test] @ weight.T + (r.intercept_ - weight @ scaler.mean_), 1)]
    return weight, r.intercept_ - weight @ scaler.mean_, float((pred == y[test]).mean())


BLOCK = {"at": AT, "target": "label", "method": "ridge", "alpha": 2.0, "control": True, "memory": "4MB"}  # ARGS'


def one_process(path, output: dict | None = None, **block) -> str:
    """The experiment's block (ARGS), uninterrupted, in this process, to the file `path` (`output`: more
    output keys; `block`: keys of the probe block changed): the run the ranks' and resumed runs equal."""
    return hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                        "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": N, "noise": 0.3}, "batch_size": B},
                        "output": {"path": str(path), **(output or {})}, "probe": {**BLOCK, **block}}).path


def assert_same_probes(got, want, sklearn: bool = True, exact: bool = True) -> None:
    """Two open runs hold the same probes: their tables, and their weights bit for bit (`exact`: the same
    rows in the same blocks) or to 1e-9; with `sklearn`, both equal scikit-learn's (reference)."""
    assert got.probes().rows == want.probes().rows
    assert [row["rows"] for row in got.probes().rows] == [N, N]
    for at in AT:
        (w, b), (w1, b1) = got.probe_weights(at), want.probe_weights(at)
        for a, e in ((w, w1), (b, b1)):
            np.testing.assert_array_equal(a, e) if exact else np.testing.assert_allclose(a, e, rtol=1e-9, atol=1e-12)
        if sklearn:
            weight, bias, test_acc = reference(at)
            np.testing.assert_allclose(w, weight, rtol=1e-6, atol=1e-9)
            np.testing.assert_allclose(b, bias, rtol=1e-6, atol=1e-9)
            assert next(r for r in got.probes().rows if r["at"] == at)["test"] == pytest.approx(test_acc)


@pytest.mark.slow
def test_two_ranks_equal_one_process_and_sklearn(tmp_path):
    two = cli(*ARGS, "hydra.run.dir=two", cwd=tmp_path, launcher=TORCHRUN)
    assert two.returncode == 0, two.stderr[-3000:]
    r2, r1 = hookrun.open_run(tmp_path / "two"), hookrun.open_run(one_process(tmp_path / "one.h5"))
    assert r2.file.attrs["world_size"] == 2
    assert_same_probes(r2, r1)  # the same rows in the same blocks: bit for bit; and scikit-learn's
    assert not list(tmp_path.glob("two/.hookrun-probe-*"))  # rank 1's rows file, removed by rank 0


@pytest.mark.parametrize("memory", [1 << 30, 3 * 10 * 6 * 8])  # held, or spilled after three batches
def test_rows_handed_over_fit_the_one_process_logistic_probe(tmp_path, memory):
    """Rank 1's rows saved and added to rank 0's batch by batch give the one-process store's rows,
    blocks and logistic probe (and scikit-learn's predictions, fitted on all the rows at once)."""
    import h5py

    from hookrun.runner.kinds.probe.fit import FitSpec, fit_point
    from hookrun.runner.kinds.probe.rows import RowStore

    g = np.random.default_rng(0)
    x = g.normal(size=(60, 6))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 0.8)
    one, zero, other = (RowStore(6, memory, tmp_path / f"{n}.h5", n) for n in ("one", "zero", "other"))
    for s in range(0, 60, 10):  # six batches: rank 0 has 0-2, rank 1 has 3-5
        rows = (torch.from_numpy(x[s:s + 10]), y[s:s + 10], np.arange(s, s + 10), np.arange(s, s + 10))
        one.add(*rows)
        (zero if s < 30 else other).add(*rows)
    with h5py.File(tmp_path / "handed.h5", "w") as f:
        other.save(f.create_group("000"))
    with h5py.File(tmp_path / "handed.h5", "r") as f:
        zero.load(f["000"])
    assert zero.spilled == one.spilled == (memory < 1 << 20)
    for a, b in zip(zero.blocks(), one.blocks(), strict=True):
        assert a[0] == b[0]
        torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
    for name in ("y", "key", "item", "part"):
        np.testing.assert_array_equal(zero.column(name), one.column(name))
    spec = FitSpec(method="logistic", C=1.0, test=0.25, seed=0)
    got, want = fit_point(zero, spec), fit_point(one, spec)
    np.testing.assert_array_equal(got["weight"], want["weight"])
    from sklearn.linear_model import LogisticRegression

    test = np.isin(np.arange(60), got["test_items"])
    sc = StandardScaler().fit(x[~test])
    ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(sc.transform(x[~test]), y[~test])
    assert got["test_score"] == pytest.approx((ref.predict(sc.transform(x[test])) == y[test]).mean())
    for s in (one, zero, other):
        s.close()
