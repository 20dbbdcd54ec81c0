"""Patching as a file run (issue 32): the grids read back labelled, resume goes on from the cells not
written, and bad inputs are one line before any forward."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

tl = pytest.importorskip("transformer_lens")
from tl_models import hooked_transformer  # noqa: E402

N, T, V = 3, 5, 40
HEADS = {"at": "blocks.*.attn.hook_z", "over": ["position", "head"], "dims": ["sample", "position", "head", "feature"]}


@pytest.fixture(scope="module")
def model():
    return hooked_transformer(V)


@pytest.fixture(scope="module")
def items():
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, V, (N, T), generator=g)
    corrupt = clean.clone()
    corrupt[:, 1] = torch.randint(0, V, (N,), generator=g)
    return [{"clean": clean[i], "corrupt": corrupt[i], "answer": torch.tensor(3), "wrong": torch.tensor(4)} for i in range(N)]


def cfg(path, **block):
    return {"data": {"inputs": {"input": "clean"}, "target": None}, "progress": False,
            "output": {"path": str(path), "flush_every": 1}, "patching": {"input": "input", "sites": {"heads": HEADS}, **block}}


def reference(model, items, sites=None):
    """The grid by TransformerLens' one-forward-per-cell function."""
    from transformer_lens import patching

    clean = torch.stack([it["clean"] for it in items])
    corrupt = torch.stack([it["corrupt"] for it in items])
    _, cache = model.run_with_cache(clean)
    return patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, lambda lg: lg[:, -1, 1].mean()).numpy()


def test_a_file_run_reads_back_as_labelled_grids(tmp_path, model, items):
    hookrun.run(cfg(tmp_path / "p.h5", cells_per_forward=7, metric={"_target_": "patch_metrics.last_logit"}), model=model, dataset=items)
    run = hookrun.open_run(tmp_path / "p.h5")
    assert run.grids == ["heads"]
    g = run.grid("heads")
    assert g.dims == ("module", "position", "head") and g.shape == (2, T, 4)
    np.testing.assert_allclose(g.values, reference(model, items), atol=1e-4)
    summary = run.summary(stats=False)
    assert "heads" in summary
    assert re.search(rf"status    complete   \(\d+ chunks of cells, {2 * T * 4} cells\)", summary), summary  # a row is a cell
    with pytest.raises(LookupError, match="heads"):
        run.grid("head")


def test_a_file_written_before_the_kind_attribute_still_reads_as_a_patching_run(tmp_path, model, items):
    """Readers ask the file's kind through the registry; a file without the root `kind` attribute is
    asked through each reader's present(f): its grids, units and report section are still patching's."""
    from hookrun.analysis.report import build_report

    hookrun.run(cfg(tmp_path / "p.h5", metric={"_target_": "patch_metrics.last_logit"}), model=model, dataset=items)
    with h5py.File(tmp_path / "p.h5", "a") as f:
        assert f.attrs["kind"] == "patching"
        del f.attrs["kind"]
    with hookrun.open_run(tmp_path / "p.h5") as run:
        assert run.grids == ["heads"]
        np.testing.assert_allclose(run.grid("heads").values, reference(model, items), atol=1e-4)
        assert f"{2 * T * 4} cells)" in run.summary(stats=False)
        assert "grids" in [s["id"] for s in build_report(run).data["sections"]]


def test_resume_continues_the_cells_not_yet_written(tmp_path, model, items):
    from patch_metrics import SIGNAL_AT

    from hookrun.output.process import Interrupted

    c = cfg(tmp_path / "p.h5", cells_per_forward=4, metric={"_target_": "patch_metrics.last_logit"})
    SIGNAL_AT[:] = [5]  # (2 base runs, then) the third chunk
    import patch_metrics
    patch_metrics.CALLS[0] = 0
    with pytest.raises(Interrupted, match=r"after \d+ chunks of cells; ") as stopped:
        hookrun.run(c, model=model, dataset=items)
    with h5py.File(tmp_path / "p.h5") as f:
        written = f["samples/index"].shape[0]
        assert f"after {f.attrs['steps_complete']} chunks of cells" in str(stopped.value)
    assert 0 < written < 2 * T * 4
    c["resume"] = True
    assert hookrun.run(c, model=model, dataset=items).status == "complete"
    run = hookrun.open_run(tmp_path / "p.h5")
    assert sorted(run.samples.tolist()) == list(range(2 * T * 4))
    np.testing.assert_allclose(run.grid("heads").values, reference(model, items), atol=1e-4)


@pytest.mark.parametrize("change, message", [
    ({"sites": {"x": {"at": "blocks.*.hook_resid_pre", "over": ["head"]}}}, "patching.sites.x.over: .head. is not an axis"),
    ({"sites": {"x": {"at": "blocks.*.attn.hook_zz", "over": ["position"]}}}, "patching.sites.x.at"),
    ({"sites": {"x": {"at": "blocks.0.hook_resid_pre", "over": ["position", "layer"]}}}, "'layer' is not an axis"),
    ({"metric": {"name": "logit_diff", "answer": "answr"}}, "patching.metric.answer='answr'.*did you mean answer"),
    ({"metric": {"_target_": "patch_metrics.batch_mean"}}, "one value per item"),
    ({"metric": {"name": "logits"}}, "patching.metric.name=.logits.*did you mean logit"),
    ({"direction": "forward"}, "patching.direction"),
])
def test_bad_inputs_are_one_line_before_any_batch(tmp_path, model, items, change, message):
    with pytest.raises(ConfigError, match=message) as exc:
        hookrun.run(cfg(tmp_path / "p.h5", **change), model=model, dataset=items)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "p.h5").exists()


def test_clean_and_corrupted_of_different_shapes_are_refused(tmp_path, model, items):
    bad = [{**it, "corrupt": it["corrupt"][:-1]} for it in items]
    with pytest.raises(ConfigError, match="same shape"):
        hookrun.patch_grid(model, bad, input="input", sites={"heads": HEADS})


def test_a_site_that_never_fires_is_refused(model, items):
    class Skip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Embedding(V, 8), torch.nn.Linear(8, 8)

        def forward(self, input):
            return self.used(input) @ self.used.weight.T

    with pytest.raises(ConfigError, match="patching.sites.u.at: unused never fired"):
        hookrun.patch_grid(Skip(), items, input="input", sites={"u": {"at": "unused", "over": ["position"]}})


@pytest.mark.parametrize("mode", ["grad", "generate"])
def test_patching_with_mode_grad_or_generate_is_refused(tmp_path, model, items, mode):
    with pytest.raises(ConfigError, match=f"patching with mode={mode}"):
        hookrun.run({**cfg(tmp_path / "p.h5"), "mode": mode}, model=model, dataset=items)
