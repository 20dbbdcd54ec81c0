"""The gram route with its rows held in memory (within `hold` bytes), spilled to a file part way, or
spooled from the start, against numpy's linear CKA, rbf CKA and RSA on the whole data (the
definitions of test_similarity_engine.py), alone and merged across two ranks' accumulators."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_similarity_engine import cka, data, dissim, flat, gram_rbf, spearman

from hookrun.runner.kinds.similarity import accumulate
from hookrun.runner.kinds.similarity.accumulate import accumulator, pairs_of

ROW = (6 + 20 + 9) * 4  # bytes of one item's rows, the three series of data() in float32
HOLDS = {"held": 1 << 30, "spilled": 20 * ROW, "spooled": 0}  # spilled: after the third batch of 7


def fed(series: list[np.ndarray], batch: int, hold: int, **kw) -> accumulate.GramRoute:
    acc = accumulator("gram", pairs_of(len(series), None), batch=batch, hold=hold, **kw)
    for s in range(0, len(series[0]), batch):
        acc.add([torch.from_numpy(x[s:s + batch]) for x in series])
    return acc


def finish(acc: accumulate.GramRoute, n: int, where: str) -> np.ndarray:
    assert bool(acc.files) == (where != "held")  # the mode under test is the one that ran
    out = acc.matrix((n, n))
    acc.close()
    return out


@pytest.mark.parametrize("where", list(HOLDS))
def test_linear_cka_in_slabs_equals_numpy(where: str, monkeypatch) -> None:
    monkeypatch.setattr(accumulate, "SLAB", 8 * 40 * 3)  # slabs of 3 columns: the Gram summed over slabs
    series = data(40)
    series[0] = series[0] + 50.0  # far from the origin: the centring must be exact
    want = np.array([[cka(flat(x) @ flat(x).T, flat(y) @ flat(y).T) for y in series] for x in series])
    np.testing.assert_allclose(finish(fed(series, 7, HOLDS[where]), 3, where), want, rtol=1e-6)
    assert want[0, 1] < 0.99


@pytest.mark.parametrize("where", list(HOLDS))
def test_rbf_cka_and_rsa_equal_numpy(where: str) -> None:
    series = data(31, seed=2)
    got = finish(fed(series, 7, HOLDS[where], measure="rbf_cka", sigma=0.5), 3, where)
    want = np.array([[cka(gram_rbf(flat(x), 0.5), gram_rbf(flat(y), 0.5)) for y in series] for x in series])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    iu = np.triu_indices(31, k=1)
    got = finish(fed(series, 7, HOLDS[where], measure="rsa", dissimilarity="euclidean"), 3, where)
    want = np.array([[spearman(dissim(flat(x), "euclidean")[iu], dissim(flat(y), "euclidean")[iu])
                      for y in series] for x in series])
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(("first", "second"), [("held", "held"), ("spilled", "held"), ("held", "spooled")])
def test_merged_ranks_equal_numpy_on_the_whole_data(tmp_path, first: str, second: str) -> None:
    """Rank 1's rows after rank 0's, whichever way each holds them; 'spilled' here: rank 0 holds its
    own 14 rows but not rank 1's, so the merge spools them all."""
    series = data(30)
    hold = {"held": 1 << 30, "spilled": 20 * ROW, "spooled": 0}
    accs = [fed([x[:14] for x in series], 7, hold[first], folder=str(tmp_path)),
            fed([x[14:] for x in series], 8, hold[second], folder=str(tmp_path))]
    assert not accs[0].files or first == "spooled"
    accs[1].save(tmp_path / "rank1")
    accs[0].merge(tmp_path / "rank1")
    k = [flat(x) @ flat(x).T for x in series]
    want = np.array([[cka(a, b) for b in k] for a in k])
    np.testing.assert_allclose(finish(accs[0], 3, "held" if first == "held" else "spilled"), want, rtol=1e-9)
    accs[1].close()
