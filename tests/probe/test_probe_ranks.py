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


def reference(at: str, alpha: float = 2.0) -> tuple[np.ndarray, np.ndarray, float]:
    """sklearn: StandardScaler -> Ridge on the one-hot labels of the training items, features pooled by
    numpy from a raw forward hook on the same model and items; (weight, bias) folded as the file's."""
    from hookrun.data.shapes import shapes
    from hookrun.models import tiny_cnn

    model, data = tiny_cnn().eval(), shapes(N, noise=0.3)
    x = torch.stack([data[i][0] for i in range(N)])
    y = np.array([int(data[i][1]) for i in range(N)])
    seen = {}
    h = model.get_submodule(at).register_forward_hook(lambda m, i, o: seen.__setitem__("o", o.detach()))
    with torch.no_grad():
        model(x)
    h.remove()
    o = seen["o"].double().numpy()
    feats = o.reshape(*o.shape[:2], -1).mean(-1) if o.ndim > 2 else o
    test = train_test_split(np.arange(N), test_size=0.25, random_state=0)[1]
    train = ~np.isin(np.arange(N), test)
    scaler = StandardScaler().fit(feats[train])
    classes = np.unique(y[train])
    onehot = (y[train][:, None] == classes[None]).astype(np.float64)
    r = Ridge(alpha=alpha).fit(scaler.transform(feats[train]), onehot)
    weight = r.coef_ / scaler.scale_
    pred = classes[np.argmax(feats[test] @ weight.T + (r.intercept_ - weight @ scaler.mean_), 1)]
    return weight, r.intercept_ - weight @ scaler.mean_, float((pred == y[test]).mean())


@pytest.mark.slow
def test_two_ranks_equal_one_process_and_sklearn(tmp_path):
    two = cli(*ARGS, "hydra.run.dir=two", cwd=tmp_path, launcher=TORCHRUN)
    assert two.returncode == 0, two.stderr[-3000:]
    one = hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                       "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": N, "noise": 0.3}, "batch_size": B},
                       "output": {"path": str(tmp_path / "one.h5")},
                       "probe": {"at": AT, "target": "label", "method": "ridge", "alpha": 2.0, "control": True,
                                 "memory": "4MB"}}).path  # (the experiment's block, in this process)
    r2, r1 = hookrun.open_run(tmp_path / "two"), hookrun.open_run(one)
    assert r2.probes().rows == r1.probes().rows
    assert [row["rows"] for row in r2.probes().rows] == [N, N]
    assert r2.file.attrs["world_size"] == 2
    for at in AT:
        w2, b2 = r2.probe_weights(at)
        w1, b1 = r1.probe_weights(at)
        np.testing.assert_array_equal(w2, w1)  # the same rows in the same blocks: bit for bit
        np.testing.assert_array_equal(b2, b1)
        weight, bias, test_acc = reference(at)
        np.testing.assert_allclose(w2, weight, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(b2, bias, rtol=1e-6, atol=1e-9)
        row = next(r for r in r2.probes().rows if r["at"] == at)
        assert row["test"] == pytest.approx(test_acc)
    assert not list(tmp_path.glob("two/.hookrun-probe-*"))  # rank 1's rows file, removed by rank 0
