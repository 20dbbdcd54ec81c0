"""probe.test_data's items are batched by the run's `data.collate`, as the training items are: token
sequences of unequal lengths, padded by a collate function, were stacked by torch's default_collate
instead (a traceback-free but false line advising the data.collate the run already gave). The
reference: each sequence run alone (no padding) through the same modules, mean-pooled by numpy, and
scikit-learn's StandardScaler -> LogisticRegression fitted on the training items, scored on the test items."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hookrun

pytest.importorskip("sklearn")
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

V, D = 40, 6


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, D)
        self.mix = nn.Linear(D, D)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.mix(self.emb(input_ids))


def pad(items: list[dict]) -> dict:
    """Right-pads the items' token ids to the batch's longest, with its attention mask."""
    t = max(len(it["input_ids"]) for it in items)
    ids = torch.zeros(len(items), t, dtype=torch.long)
    mask = torch.zeros(len(items), t, dtype=torch.long)
    for i, it in enumerate(items):
        ids[i, :len(it["input_ids"])] = it["input_ids"]
        mask[i, :len(it["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "label": torch.tensor([it["label"] for it in items])}


class Sequences(torch.utils.data.Dataset):
    def __init__(self, n: int = 48, seed: int = 0) -> None:
        g = np.random.default_rng(seed)
        self.items = [{"input_ids": torch.tensor(g.integers(1, V, size=int(k))), "label": 0}
                      for k in g.integers(2, 10, size=n)]
        for it in self.items:
            it["label"] = int(it["input_ids"][0] >= V // 2)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def pooled(model: Tokens, data: Sequences) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence alone through the model, its `mix` output (a raw forward hook) averaged by numpy."""
    out: list[torch.Tensor] = []
    h = model.mix.register_forward_hook(lambda m, a, o: out.append(o.detach().double()))
    with torch.no_grad():
        for it in data.items:
            model(it["input_ids"][None])
    h.remove()
    return np.stack([o[0].numpy().mean(0) for o in out]), np.array([it["label"] for it in data.items])


def test_test_data_is_batched_by_the_runs_collate(tmp_path) -> None:
    model, train, test = Tokens().eval(), Sequences(48, 0), Sequences(20, 1)
    path = tmp_path / "p.h5"
    cfg = {"data": {"batch_size": 8, "collate": {"_target_": f"{__name__}.pad", "_partial_": True}}, "device": "cpu",
           "progress": False, "output": {"path": str(path), "overwrite": True},
           "probe": {"at": ["mix"], "target": "label", "pool": "mean", "control": False,
                     "test_data": {"dataset": {"_target_": f"{__name__}.Sequences", "n": 20, "seed": 1}}}}
    hookrun.run(cfg, model=model, dataset=train)
    x, y = pooled(model, train)
    xt, yt = pooled(model, test)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, tol=1e-10, max_iter=10000)).fit(x, y)
    with hookrun.open_run(path) as run:
        row = run.probes().rows[0]
        weight, bias = run.probe_weights("mix")
    assert row["rows"] == 48 + 20
    assert row["train"] == pytest.approx(ref.score(x, y), abs=1e-12)
    assert row["test"] == pytest.approx(ref.score(xt, yt), abs=1e-12)
    assert np.mean((xt @ weight.T + bias)[:, 0] > 0) > 0  # (both classes predicted: not a constant probe)
    assert np.mean(((xt @ weight.T + bias)[:, 0] > 0) == ref.predict(xt)) >= 0.995
