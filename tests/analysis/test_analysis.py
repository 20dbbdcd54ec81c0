"""open_run / open_sweep, inspect, plot, dry_run: values against numpy on the same data."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import torch
from conftest import batches, make_cfg

import hookrun
from hookrun import open_run
from hookrun.analysis.run_reader import block_stats
from hookrun.errors import ConfigError, NotFoundError

HOOKS = {
    "blocks": {"at": "layer1.*", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
    "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
}


@pytest.fixture
def run_file(tmp_path, checkpoint):
    return hookrun.run(make_cfg(tmp_path, checkpoint, HOOKS)).path


def reference_logits(model, dataset):
    with torch.no_grad():
        return torch.cat([model(x) for x, _ in batches(dataset)]).numpy()


def test_open_run_describes_the_run(run_file, dataset):
    with open_run(run_file) as run:
        assert run.status == "complete"
        assert run.config["hooks"] == HOOKS
        np.testing.assert_array_equal(run.samples, np.arange(len(dataset)))
        np.testing.assert_array_equal(run.targets, dataset.y.numpy())
        labels = sorted(c.label for c in run.captures)
        assert labels == ["blocks/layer1.0/output", "blocks/layer1.1/output", "logits/fc/output"]
        info = run.find("fc", "output")
        assert info.shape == (12, 10) and info.dtype == "float32" and info.rows == "samples" and info.nbytes > 0
    with open_run(run_file.parent) as run:  # a run folder works too
        assert run.status == "complete"


def test_capture_is_lazy_and_matches_the_model(run_file, reference_model, dataset):
    want = reference_logits(reference_model, dataset)
    with open_run(run_file) as run:
        x = run["fc", "output"]
        assert not isinstance(x, np.ndarray)  # an h5py dataset: nothing read yet
        np.testing.assert_allclose(x[3:7], want[3:7], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(run["logits/fc/output"][:], want, rtol=1e-5, atol=1e-6)
        got = np.concatenate(list(run.iter("fc", "output", batch_size=5)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert [len(b) for b in run.iter("fc", "output", batch_size=5)] == [5, 5, 2]


def test_stats_match_numpy(run_file):
    with open_run(run_file) as run:
        for key in (("fc", "output"), ("layer1.0", "output")):
            a = run[key][:].astype(np.float64)
            s = run.stats(*key)
            np.testing.assert_allclose([s["mean"], s["std"], s["min"], s["max"], s["zeros"]],
                                       [a.mean(), a.std(), a.min(), a.max(), (a == 0).mean()], rtol=1e-9, atol=1e-12)
            small_blocks = block_stats(run.file[run.find(*key).path], rows_per_block=5)  # merged block by block
            np.testing.assert_allclose(small_blocks["std"], a.std(), rtol=1e-9)
            assert run.stats(*key)["count"] == a.size



def test_stats_leave_out_nan_and_say_how_many(tmp_path):
    """A capture with NaN or inf beside its finite values (an edges grid's cells that are not edges)
    gets the finite values' statistics (numpy's nan-functions on the same data) and the count left
    out, block by block and merged, never "no finite value (all NaN)"."""
    import h5py

    from hookrun.analysis.stats import no_values, nonfinite_note

    rng = np.random.default_rng(0)
    a = rng.normal(size=(40, 3))
    a[rng.random(a.shape) < 0.4] = np.nan
    a[0, 0], a[5, 1], a[7, 2] = np.inf, -np.inf, 0.0
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["v"], f["all_nan"] = a, np.full(4, np.nan)
        finite = a[np.isfinite(a)]
        for rows in (None, 3):
            s = block_stats(f["v"], rows_per_block=rows)
            np.testing.assert_allclose([s["mean"], s["std"], s["min"], s["max"], s["zeros"]],
                                       [finite.mean(), finite.std(), finite.min(), finite.max(), (finite == 0).mean()], rtol=1e-12)
            assert (s["count"], s["values"], s["nonfinite"]) == (finite.size, a.size, a.size - finite.size)
        assert nonfinite_note(s) == f" nonfinite {a.size - finite.size} ({(a.size - finite.size) / a.size:.1%}, left out of the statistics)"
        empty = block_stats(f["all_nan"])
        assert (empty["count"], empty["values"]) == (0, 4) and no_values("x/v", empty) == "no finite value (4 values, all NaN or inf)"

def test_unknown_and_ambiguous_captures(run_file, tmp_path, checkpoint):
    with open_run(run_file) as run, pytest.raises(NotFoundError, match="no capture 'fc/input'"):
        run.find("fc", "input")
    twice = {"a": HOOKS["logits"], "b": HOOKS["logits"]}
    path = hookrun.run(make_cfg(tmp_path / "two", checkpoint, twice)).path
    with open_run(path) as run:
        with pytest.raises(NotFoundError, match="several hooks recorded 'fc' 'output': give the hook too, one of a, b"):
            run.find("fc", "output")
        assert run.find("b", "fc", "output").hook == "b"
    with pytest.raises(NotFoundError, match="no file"):
        open_run(tmp_path / "missing.h5")


def test_to_xarray_has_named_dims(run_file, reference_model, dataset):
    xr = pytest.importorskip("xarray")
    with open_run(run_file) as run:
        ds = run.to_xarray()
    assert isinstance(ds, xr.Dataset)
    logits = ds["logits/fc/output"]
    assert logits.dims == ("sample", "feature")  # named by meaning; the two layer1 blocks share theirs
    np.testing.assert_array_equal(logits["sample"].values, np.arange(len(dataset)))
    np.testing.assert_allclose(logits.values, reference_logits(reference_model, dataset), rtol=1e-5, atol=1e-6)
    fmap = ds["blocks/layer1.0/output"]
    assert fmap.dims == ds["blocks/layer1.1/output"].dims == ("sample", "channel", "height", "width")
    assert ds.attrs["status"] == "complete"


def test_to_xarray_takes_row_numbers_in_any_order_as_numpy_does(run_file, reference_model, dataset):
    """rows=[2, 0] raised h5py's "Indexing elements must be in increasing order"; rows=[] gave every row."""
    pytest.importorskip("xarray")
    want = reference_logits(reference_model, dataset)
    pick = [2, 0, 2, -1]
    with open_run(run_file) as run:
        ds = run.to_xarray(rows=pick)
        np.testing.assert_allclose(ds["logits/fc/output"].values, want[pick], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ds["sample"].values, np.arange(len(dataset))[pick])
        assert run.to_xarray(rows=np.array([], dtype=int))["logits/fc/output"].shape == (0, want.shape[1])
        with pytest.raises(hookrun.errors.HookrunError, match=rf"rows: {len(dataset)} is past the {len(dataset)} rows"):
            run.to_xarray(rows=[0, len(dataset)])


def test_to_xarray_keeps_the_whole_models_label_apart_from_a_submodule_named_model(tmp_path):
    """(was: both named `out/model/output`, one of the two silently dropped from the Dataset)"""
    pytest.importorskip("xarray")
    from torch import nn

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Linear(8, 4)

        def forward(self, x):
            return self.model(x) * 2

    torch.manual_seed(0)
    net, x = Wrap().eval(), torch.randn(6, 8)
    cfg = {"hooks": {"out": {"at": ["", "model"], "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "data": {"batch_size": 3},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "w.h5")}}
    path = hookrun.run(cfg, model=net, dataset=torch.utils.data.TensorDataset(x)).path
    with open_run(path) as run:
        ds = run.to_xarray()
        alone = run.to_xarray(["out/(model)/output"])
    with torch.no_grad():
        inner = net.model(x).numpy()
    assert sorted(ds.data_vars) == ["out/(model)/output", "out/model/output"] and list(alone.data_vars) == ["out/(model)/output"]
    np.testing.assert_allclose(ds["out/(model)/output"].values, inner * 2, rtol=1e-6)
    np.testing.assert_allclose(ds["out/model/output"].values, inner, rtol=1e-6)


def test_dry_run_estimate_equals_the_real_file(tmp_path, checkpoint, capsys):
    hooks = {**HOOKS, "pooled": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", "reduce": "mean", "dtype": "float16"}]}}
    dry = hookrun.run(make_cfg(tmp_path, checkpoint, hooks, dry_run=True))
    printed = capsys.readouterr().out
    assert "hookrun plan (dry run: nothing is written)" in printed
    assert "hook blocks: forward -> 2 targets: layer1.0, layer1.1" in printed
    assert "layer2 output" in printed and "float16" in printed and "estimated file size" in printed
    assert not list(tmp_path.iterdir())  # nothing written
    real = hookrun.run(make_cfg(tmp_path, checkpoint, hooks))
    with open_run(real.path) as run:
        data_bytes = sum(int(np.prod(c.shape)) * np.dtype(c.dtype).itemsize for c in run.captures)
    with h5py.File(real.path) as f:  # (the sample columns' chunks held 8192 rows: three 64 KiB for 12 samples)
        allocated = sum(f[f"samples/{n}"].id.get_storage_size() for n in ("index", "step", "target"))
        assert allocated == 3 * 12 * 8, allocated
        checksums = f["checksums"].id.get_storage_size()  # (output.checksum=true, the default)
    # /samples/target and /checksums were left out: output.max_bytes let a file 27% over it through;
    # the estimate counts HDF5's metadata too: the file is no larger, and not much smaller
    assert data_bytes + allocated + checksums < os.path.getsize(real.path) <= dry.estimated_bytes
    assert dry.estimated_bytes <= 1.1 * os.path.getsize(real.path)
    bare = make_cfg(tmp_path / "c", checkpoint, hooks, dry_run=True)
    bare["output"]["checksum"] = False
    dry = hookrun.run(bare)
    bare.update(dry_run=False)
    with h5py.File(path := hookrun.run(bare).path) as f:
        assert "checksums" not in f
    assert data_bytes + allocated < os.path.getsize(path) <= dry.estimated_bytes <= 1.1 * os.path.getsize(path)


def test_max_bytes_refuses_before_any_batch(tmp_path, checkpoint):
    with pytest.raises(ConfigError, match=r"estimated file size .* exceeds output.max_bytes=1000"):
        hookrun.run(make_cfg(tmp_path, checkpoint, HOOKS, **{"output.max_bytes": 1000}))
    assert not (tmp_path / "captures.h5").exists()
    assert hookrun.run(make_cfg(tmp_path, checkpoint, HOOKS, **{"output.max_bytes": 10**9})).steps == 3


def test_plot_writes_real_images(run_file, tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    from hookrun.cli.plot_command import main

    assert main([str(run_file), "--out", str(tmp_path / "fig")]) == 0
    names = sorted(p.name for p in (tmp_path / "fig").glob("*.png"))
    assert names == ["fmap_blocks__layer1.0__output.png", "fmap_blocks__layer1.1__output.png",
                     "hist_blocks__layer1.0__output.png", "hist_blocks__layer1.1__output.png", "hist_logits__fc__output.png"]
    for name in names:
        img = plt.imread(tmp_path / "fig" / name)
        assert img.shape[0] > 100 and img.shape[1] > 100 and img[..., :3].std() > 0.05


def test_gradcam_matches_the_formula_and_is_drawn(tmp_path, checkpoint, reference_model, dataset):
    pytest.importorskip("matplotlib")
    from hookrun.analysis.gradcam import gradcam, gradcam_pairs
    from hookrun.cli.plot_command import main

    hooks = {"fmap": {"at": "layer3", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "g": {"at": "layer3", "type": "tensor", "actions": ["record"]}}
    path = hookrun.run(make_cfg(tmp_path, checkpoint, hooks, mode="grad",
                                loss={"_target_": "hookrun.runner.losses.target_logit", "_partial_": True})).path
    with open_run(path) as run:
        (act, grad), = gradcam_pairs(run)
        cam = gradcam(run.file[act.path][:], run.file[grad.path][:])
    m = reference_model
    x, y = next(batches(dataset))
    kept = {}
    h = m.layer3.register_forward_hook(lambda mod, a, out: kept.update(a=out) or None)
    logits = m(x)
    h.remove()
    (g,) = torch.autograd.grad(logits.gather(1, y.view(-1, 1)).sum(), [kept["a"]])
    ref = torch.relu((g.mean(dim=(2, 3), keepdim=True) * kept["a"]).sum(1)).detach().numpy()
    ref = ref / np.maximum(ref.reshape(len(ref), -1).max(1), 1e-30).reshape(-1, 1, 1)
    np.testing.assert_allclose(cam[:4], ref, atol=1e-4)
    assert main([str(path), "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "gradcam_layer3.png").stat().st_size > 5000


def test_gradcam_pictures_past_the_recorded_images_draw_those_that_have_one(tmp_path):
    """plot --samples 9 on a run whose input was recorded with limit 8 drew no image under any map and
    said the run recorded none. Reference: the input rows read with h5py."""
    from hookrun.analysis.gradcam import pictures
    from hookrun.analysis.images import as_pictures

    cfg = hookrun.compose("experiment=shapes_gradcam", "data.dataset.size=8", "data.batch_size=4", "device=cpu",
                          "progress=false", "hooks.images.actions.0.limit=3", f"output.path={tmp_path / 'g.h5'}")
    path = hookrun.run(cfg).path
    with open_run(path) as run:
        ((stem, spec),) = pictures(run, samples=5)
        assert stem == "gradcam_block3" and len(spec.maps) == len(spec.captions) == 3
        assert "the first 3: the input image was recorded for those" in spec.title
        want = as_pictures(run.file["captures/images/__model__/input"][:3])  # (the file's own dataset, h5py)
        np.testing.assert_array_equal(np.asarray(spec.pictures), np.asarray(want))
        ((_, all_four),) = pictures(run, samples=2)
        assert len(all_four.maps) == 2 and all_four.pictures is not None and "the first" not in all_four.title
