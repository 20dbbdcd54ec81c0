"""What a similarity run's forwards see: token rows of another length than the batch's attention_mask
(a model that adds a CLS token) and a `with:` model run after a first model that changes its inputs in
place. References: the submodules called directly on the same inputs, pooled and compared in numpy."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from similarity_models import LENGTH, WIDTH, Cls, Texts
from test_similarity_engine import cka

import hookrun
from hookrun.errors import ConfigError


def config(path, pool: str, at: tuple = ("e", "enc")) -> dict:
    return {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "output": {"path": str(path)},
            "similarity": {"at": list(at), "pool": pool}}


@pytest.mark.parametrize("pool", ["mean", "flatten"])
def test_token_rows_longer_than_the_mask_over_padding_are_refused_before_any_batch(tmp_path, pool) -> None:
    """`enc` (11 tokens, a CLS added) over a padded mask of 10: pool=mean averaged the padding in (CKA 0.90
    where the real tokens give 0.98) and flatten took it as features; now one line naming both lengths."""
    with pytest.raises(ConfigError) as err:
        hookrun.run(config(tmp_path / "r.h5", pool, ("enc",)), model=Cls().eval(), dataset=Texts(padded=0))
    assert str(err.value).startswith(f"similarity.at: enc: its token rows are {LENGTH + 1} long and the batch's "
                                     f"attention_mask {LENGTH} (a model that adds tokens, a CLS)")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "r.h5").exists()  # (before any batch: no file)


def test_token_rows_longer_than_the_mask_refused_mid_run_mark_the_file_failed(tmp_path) -> None:
    """The first batches have no padding, a later one has: the run stops there, its file marked failed."""
    with pytest.raises(ConfigError, match=f"enc: its token rows are {LENGTH + 1} long and the batch's attention_mask"):
        hookrun.run(config(tmp_path / "m.h5", "mean"), model=Cls().eval(), dataset=Texts(padded=8))
    with h5py.File(tmp_path / "m.h5") as f:
        assert f.attrs["status"] == "failed"


@pytest.mark.parametrize("pool", ["mean", "flatten"])
def test_token_rows_of_another_length_without_padding_are_every_token(tmp_path, pool) -> None:
    """No padding: every token is real, the CLS too; the matrix equals numpy's CKA of the submodules'
    outputs, called directly, averaged (or flattened) over all their tokens."""
    model, data = Cls().eval(), Texts(padded=16)
    path = hookrun.run(config(tmp_path / "n.h5", pool), model=model, dataset=data).path
    with torch.no_grad():
        e = model.e(data.ids)
        enc = model.enc(torch.cat([model.cls.expand(len(e), 1, WIDTH), e], 1))
    feats = [t.double().numpy() for t in (e, enc)]
    feats = [f.mean(1) if pool == "mean" else f.reshape(len(f), -1) for f in feats]
    k = [f @ f.T for f in feats]
    with h5py.File(path) as f:
        got = f["captures/similarity/__model__/linear_cka"][()]
    np.testing.assert_allclose(got, [[cka(a, b) for b in k] for a in k], rtol=1e-6)


class Clamps(torch.nn.Module):
    """A forward that changes its input in place (x.clamp_) before its Linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(10, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.clamp_(min=0)
        return self.lin(x)


class Same(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.p(x)


def test_the_with_model_sees_the_batch_as_it_came_not_as_the_first_model_left_it() -> None:
    """The `with:` model ran on the inputs the first model had clamped in place (CKA 0.724 where the raw
    inputs give 0.539). Reference: numpy's CKA of the Linear on the clamped inputs and the raw inputs."""
    pytest.importorskip("xarray")
    x = torch.randn(30, 10, generator=torch.Generator().manual_seed(0))
    data = [(x[i].clone(), 0) for i in range(30)]
    first = Clamps().eval()
    got = hookrun.similarity(first, data, at=["lin"], batch_size=6, with_={"model": Same(), "at": ["p"]})
    with torch.no_grad():
        a = first.lin(x.clamp(min=0)).double().numpy()
    b = x.double().numpy()
    np.testing.assert_allclose(got.values, [[cka(a @ a.T, b @ b.T)]], rtol=1e-6)


class Routed(torch.nn.Module):
    """`pos`: learned positions, one (1, tokens, 5) table the batch shares; `gate`, `gate2`: routers over the
    batch's tokens flattened, (batch x tokens, 3); `emb`: token rows (batch, tokens, 5)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.pos = torch.nn.Embedding(20, 5), torch.nn.Embedding(6, 5)
        self.gate, self.gate2 = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids) + self.pos(torch.arange(input_ids.shape[1])[None])
        g = (self.gate(h.reshape(-1, 5)) + self.gate2(h.reshape(-1, 5))).softmax(-1)
        return h * g.reshape(*h.shape[:2], 3)[..., :1]


@pytest.mark.parametrize(("at", "with_at", "message"), [
    (["pos"], None, "similarity.at: pos's output (1, 6, 5) has 1 rows on its first axis for a batch of 8 items"),
    (["gate", "gate2"], None, "similarity.at: gate's output (48, 3) has 48 rows on its first axis for a batch of 8 items"),
    (["emb"], ["pos"], "similarity.with.at: pos's output (1, 6, 5) has 1 rows on its first axis for a batch of 8 items")])
def test_an_output_whose_first_axis_is_not_the_batch_is_one_line_before_any_batch(tmp_path, at, with_at, message) -> None:
    """A position table's (1, tokens, 5) was one row per batch, read as 'the same features for every item' (n/a),
    and two routers' (batch x tokens, 3) were compared over 96 token rows as if they were items (CKA 0.428, with
    no word); now one line naming the key, the module and both counts, as the probe's, and no file. Reference:
    the shapes a raw forward hook sees, and numpy's CKA of `emb`'s mean over tokens, which still runs."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 20, (16, 6), generator=g)
    data = [{"input_ids": i} for i in ids]
    model = Routed().eval()
    seen = {}
    hooks = [getattr(model, n).register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, tuple(o.shape)))
             for n in ("pos", "gate")]
    with torch.no_grad():
        model(ids[:8])
    for h in hooks:
        h.remove()
    assert seen == {"pos": (1, 6, 5), "gate": (48, 3)}
    block = {"at": at, "pool": "mean"} | ({"with": {"model": {"_target_": "test_similarity_inputs.Routed"}, "at": with_at}}
                                          if with_at else {})
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "r.h5")},
           "similarity": block}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=model, dataset=data)
    assert str(err.value).startswith(f"{message}: not batch first (an output shared by the batch")
    assert "\n" not in str(err.value) and not (tmp_path / "r.h5").exists()
    cfg = {**cfg, "data": {"batch_size": 8, "inputs": {"input": "input_ids"}}, "similarity": {"at": ["0", "1"], "pool": "mean"},
           "output": {"path": str(tmp_path / "ok.h5")}}
    got = hookrun.run(cfg, model=torch.nn.Sequential(model.emb, torch.nn.Tanh()), dataset=data).path
    with torch.no_grad():
        a = model.emb(ids).double()
    b = torch.tanh(a).mean(1).numpy()
    a = a.mean(1).numpy()
    with h5py.File(got) as f:
        np.testing.assert_allclose(f["captures/similarity/__model__/linear_cka"][0, 1], cka(a @ a.T, b @ b.T), rtol=1e-6)


def test_a_with_model_that_rejects_the_batch_is_one_line_naming_it() -> None:
    """A `with:` model whose inputs are 5 wide, on 6-wide items, raised 'the model's forward failed:
    Sequential(...)' at the first batch: the run's own model (a Sequential too) blamed, exit 1 as a failure
    during the run. Now one ConfigError line (exit 2) naming similarity.with.model and the model's own message,
    no file; one that fails at a later batch is one RunError line naming it, the file marked failed.
    Reference: the second model called directly on the same items raises that message."""
    import tempfile
    from pathlib import Path

    from similarity_models import narrow_mlp

    from hookrun.errors import RunError

    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError) as own:
        narrow_mlp()(x[:4])
    model, data = torch.nn.Sequential(torch.nn.Linear(6, 4)).eval(), torch.utils.data.TensorDataset(x, torch.zeros(16))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "output": {"path": f"{tmp}/w.h5"},
               "similarity": {"at": ["0"], "with": {"model": {"_target_": "similarity_models.narrow_mlp"}, "at": ["0"]}}}
        with pytest.raises(ConfigError) as err:
            hookrun.run(cfg, model=model, dataset=data)
        assert str(err.value).startswith("similarity.with.model: the second model's forward failed: Sequential([4, 6] "
                                         f"float32) raised RuntimeError: {own.value}")
        assert err.value.exit_code == 2 and "\n" not in str(err.value) and not Path(f"{tmp}/w.h5").exists()
        cfg["similarity"]["with"]["model"]["raise_at"] = 3  # (call 1: the check on batch 0, which step 0 reuses; 3: batch 2)
        five = torch.utils.data.TensorDataset(x[:, :5].contiguous(), torch.zeros(16))
        with pytest.raises(RunError) as err:
            hookrun.run(cfg, model=torch.nn.Sequential(torch.nn.Linear(5, 4)).eval(), dataset=five)
        assert str(err.value).startswith("similarity.with.model: the second model's forward failed: Sequential([4, 5] "
                                         "float32) raised RuntimeError: the second model's own error")
        with h5py.File(f"{tmp}/w.h5") as f:
            assert f.attrs["status"] == "failed"
